//! The rules a violation can break ([`Invariant`]), the violation the
//! checker reports ([`InvariantViolation`]), and what a part of the
//! checker reports before the router dates it ([`Breach`]).

use core::fmt;

use thiserror::Error;

use crate::time::Time;

/// Which rule a violation breaks: one of invariants 1 to 7 of PROTOCOL.md
/// section 5, or another rule of the protocol that the checker's model of
/// the session relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Invariant {
    /// 1. Every operation ends in exactly one outcome: never none, never two.
    OneOutcome,
    /// 2. An answer is attributed to an operation only if id, op and key
    ///    all agree.
    Attribution,
    /// 3. An acquire whose bytes were handed out is never sent again.
    NoResend,
    /// 4. Unanswered requests on a connection never exceed the window, and
    ///    acquires never exceed `window - reserved`; nothing is sent before
    ///    `W`.
    Window,
    /// 5. A grant whose outcome could not be delivered, or that no pending
    ///    request claimed, is released by its exact token unless its lease
    ///    has run out; a grant the embedder holds is never released behind
    ///    its back.
    OrphanRelease,
    /// 6. The same inputs at the same times give the same actions, byte for
    ///    byte.
    Determinism,
    /// 7. `valid_until` never runs past what a `G` proves; a renewal is sent
    ///    only for a grant the embedder holds, that is not being released,
    ///    whose `valid_until` has not passed.
    Renewal,
    /// Another rule of PROTOCOL.md sections 2 to 5, or of the driver
    /// contract of [`Client`](crate::client::Client) (what an `H` carries,
    /// closing after an illegal frame, which outcome fits which history,
    /// API results).
    Protocol,
}

impl Invariant {
    /// The invariant's number in PROTOCOL.md section 5 (`None` for
    /// [`Invariant::Protocol`]).
    pub fn number(self) -> Option<u8> {
        match self {
            Invariant::OneOutcome => Some(1),
            Invariant::Attribution => Some(2),
            Invariant::NoResend => Some(3),
            Invariant::Window => Some(4),
            Invariant::OrphanRelease => Some(5),
            Invariant::Determinism => Some(6),
            Invariant::Renewal => Some(7),
            Invariant::Protocol => None,
        }
    }

    /// The rule, in words.
    pub fn statement(self) -> &'static str {
        match self {
            Invariant::OneOutcome => "every operation ends in exactly one outcome",
            Invariant::Attribution => {
                "an answer is attributed to an operation only if id, op and key all agree"
            }
            Invariant::NoResend => "an acquire whose bytes were handed out is never sent again",
            Invariant::Window => {
                "unanswered requests never exceed the window, acquires never exceed window - reserved, nothing is sent before W"
            }
            Invariant::OrphanRelease => {
                "an unclaimed or undeliverable grant is released by its exact token unless its lease ran out, and a held grant never is"
            }
            Invariant::Determinism => "the same inputs give the same actions, byte for byte",
            Invariant::Renewal => {
                "valid_until never runs past what a G proves, and a renewal goes only for a held, unreleased, unexpired grant"
            }
            Invariant::Protocol => "the protocol and the driver contract",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number() {
            Some(n) => write!(f, "invariant {n} ({})", self.statement()),
            None => write!(f, "protocol rule ({})", self.statement()),
        }
    }
}

/// A broken invariant: which one, when, at which step, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{invariant} broken at {at}, step {step}: {detail}")]
pub struct InvariantViolation {
    /// The rule broken.
    pub invariant: Invariant,
    /// The time of the step.
    pub at: Time,
    /// The step's number (from 0), as counted by
    /// [`Checker::end_step`](super::Checker::end_step).
    pub step: u64,
    /// What happened, readably.
    pub detail: String,
}

/// A rule broken, as a part of the checker finds it: which rule and what
/// happened. The router dates it ([`Breach::at`]): the parts are told the
/// time they need, never the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Breach {
    pub(super) invariant: Invariant,
    pub(super) detail: String,
}

impl Breach {
    pub(super) fn new(invariant: Invariant, detail: impl Into<String>) -> Breach {
        Breach {
            invariant,
            detail: detail.into(),
        }
    }

    /// The violation it is at `at`, in step `step`.
    pub(super) fn at(self, at: Time, step: u64) -> InvariantViolation {
        InvariantViolation {
            invariant: self.invariant,
            at,
            step,
            detail: self.detail,
        }
    }
}

/// What a part's check gives: `T`, or the rule broken.
pub(super) type Verdict<T = ()> = Result<T, Breach>;

/// A check that failed: `invariant` broken, as `detail` says.
pub(super) fn breach<T>(invariant: Invariant, detail: impl Into<String>) -> Verdict<T> {
    Err(Breach::new(invariant, detail))
}
