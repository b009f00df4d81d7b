//! The timeline: the time of each input, the window a step's timers fire
//! in, the step count, the trace of everything observed (invariant 6), and
//! what a step owes by its end: no output after a call with another
//! client's grant, which must change nothing; a close that a renewal
//! command's result was right only with.

use core::fmt;

use super::invariant::{breach, Breach, InvariantViolation, Verdict};
use super::rounds::Window;
use super::{Invariant, Session};
use crate::client::{Error as ClientError, Grant};
use crate::testkit::TraceHash;
use crate::time::Time;

pub(super) struct Timeline {
    /// The time of the latest input (never going back).
    now: Time,
    /// The time of the input before this step's: timers that fire in this
    /// step are due after it.
    from: Time,
    /// Steps ended.
    step: u64,
    trace: TraceHash,
    /// Bytes were handed to the client in this step.
    read_bytes: bool,
    /// A call that must change nothing was made this step.
    quiet_call: Option<&'static str>,
    /// A renewal command's result that is right only if the client closed
    /// its connection before the command, within the call: the close must
    /// come in this step. What was answered.
    close_owed: Option<String>,
}

impl Timeline {
    pub(super) fn new(now: Time) -> Timeline {
        Timeline {
            now,
            from: now,
            step: 0,
            trace: TraceHash::new(),
            read_bytes: false,
            quiet_call: None,
            close_owed: None,
        }
    }

    pub(super) fn now(&self) -> Time {
        self.now
    }

    /// The hash of everything traced so far.
    pub(super) fn hash(&self) -> u64 {
        self.trace.get()
    }

    /// An input `what` at `now`: traced, and the step's window moves on.
    pub(super) fn tick(&mut self, now: Time, what: &str) {
        self.from = self.now;
        self.now = self.now.max(now);
        self.trace.write(what.as_bytes());
        self.trace.write_u64(now.as_nanos());
    }

    /// When what this step shows may have happened.
    pub(super) fn window(&self) -> Window {
        Window {
            lo: self.from,
            hi: self.now,
        }
    }

    /// Traces bytes.
    pub(super) fn write(&mut self, bytes: &[u8]) {
        self.trace.write(bytes);
    }

    /// Traces a number.
    pub(super) fn write_u64(&mut self, n: u64) {
        self.trace.write_u64(n);
    }

    /// Traces a value as its `Debug` text.
    pub(super) fn write_debug(&mut self, value: &dyn fmt::Debug) {
        self.trace.write(format!("{value:?}").as_bytes());
    }

    /// Traces a grant: its key, token and `expires_by`.
    pub(super) fn write_grant(&mut self, grant: &Grant) {
        self.trace.write(grant.key().as_bytes());
        self.trace.write_u64(grant.token());
        self.trace.write_u64(grant.expires_by().as_nanos());
    }

    /// Bytes were handed to the client in this step.
    pub(super) fn bytes_read(&mut self) {
        self.read_bytes = true;
    }

    /// Whether bytes were handed to the client in this step.
    pub(super) fn read_bytes(&self) -> bool {
        self.read_bytes
    }

    /// A result was right only if the client closed its connection within
    /// the call (`what`): the close must come in this step.
    pub(super) fn owe_close(&mut self, what: String) {
        self.close_owed = Some(what);
    }

    /// A part's breach, dated now and in this step.
    pub(super) fn violation(&self, breach: Breach) -> InvariantViolation {
        breach.at(self.now, self.step)
    }

    /// A part's verdict, its breach dated now and in this step.
    pub(super) fn judge<T>(&self, verdict: Verdict<T>) -> Result<T, InvariantViolation> {
        verdict.map_err(|b| self.violation(b))
    }

    /// A violation of `invariant`, now and in this step.
    pub(super) fn fail<T>(
        &self,
        invariant: Invariant,
        detail: impl Into<String>,
    ) -> Result<T, InvariantViolation> {
        self.judge(breach(invariant, detail))
    }

    /// The client handed out `output` (an action or an event): wrong after
    /// a call that must change nothing.
    pub(super) fn loud(&self, output: &dyn fmt::Debug) -> Verdict {
        match self.quiet_call {
            Some(call) => breach(
                Invariant::Protocol,
                format!(
                    "{output:?} after {call} with another client's grant, which must change nothing"
                ),
            ),
            None => Ok(()),
        }
    }

    /// A call (`release`, `undeliverable`, `renew`, `auto_renew`,
    /// `stop_renewing`, by `call`) was made with a grant that another
    /// client issued, and returned `result`: it must be refused with
    /// `ForeignGrant` naming that grant (or, once shut down, as any call
    /// then is), and change nothing until the step ends ([`Timeline::loud`]).
    pub(super) fn foreign(
        &mut self,
        call: &'static str,
        grant: &Grant,
        result: &Result<(), ClientError>,
        session: Session,
    ) -> Verdict {
        self.quiet_call = Some(call);
        let renewal = !matches!(call, "release" | "undeliverable");
        let foreign = ClientError::ForeignGrant {
            key: grant.key().clone(),
            token: grant.token(),
        };
        let Session { shutting, complete } = session;
        let fits = match result {
            Err(ClientError::Finished) => shutting,
            Err(ClientError::ShuttingDown) => renewal && shutting && !complete,
            Err(e) => *e == foreign && !(renewal && shutting) && !complete,
            Ok(()) => false,
        };
        if !fits {
            return breach(
                Invariant::Protocol,
                format!(
                    "{call} with a grant of ({}, {}) from another client gave {result:?}, not {foreign:?}",
                    grant.key(),
                    grant.token()
                ),
            );
        }
        Ok(())
    }

    /// The client closed its connection: a close owed came.
    pub(super) fn closed(&mut self) {
        self.close_owed = None;
    }

    /// At the end of a step: no close is still owed (forgetting it).
    pub(super) fn owes_no_close(&mut self) -> Verdict {
        match self.close_owed.take() {
            Some(what) => breach(
                Invariant::Protocol,
                format!(
                    "{what}: the grant expired and its renewal is in flight, so it is still known unless a close came first, and none came"
                ),
            ),
            None => Ok(()),
        }
    }

    /// Ends the step: what it owed is forgotten, and the count moves on.
    pub(super) fn end_step(&mut self) {
        self.quiet_call = None;
        self.read_bytes = false;
        self.step += 1;
    }

    pub(super) fn step(&self) -> u64 {
        self.step
    }
}
