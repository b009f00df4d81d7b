//! What the client core hands out: actions for the driver, outcomes of
//! operations, notices for the embedder, and the errors of API misuse.

use core::fmt;
use core::time::Duration;

use bytes::Bytes;
use thiserror::Error;

use core::sync::atomic::{AtomicU64, Ordering};

use super::store::Handle;
use crate::names::{Endpoint, Key, Name};
use crate::time::Time;
use crate::wire::FrameError;

crate::conn_id::conn_id! {
    /// Names one connection attempt. Every [`Action::Connect`] has a new one;
    /// inputs about an older connection are ignored.
    ConnId
}

/// Names one operation (an acquire or a release) for its whole life, across
/// all its attempts, or a grant the embedder holds ([`Grant`]'s handle).
/// An operation's outcome comes back as [`Event::Outcome`] with its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub(crate) u64);

/// What an [`OpId`] names: it says which of the client's slabs holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Acquire,
    Release,
    Grant,
}

/// Where an [`OpId`] keeps its kind: the two bits above a slot number
/// (a table never holds more than 2^30 records: `store::MAX_RECORDS`).
const KIND_SHIFT: u32 = 30;

impl OpId {
    /// The id of the entry `handle` of the slab of `kind`.
    pub(crate) fn of(kind: OpKind, handle: Handle) -> OpId {
        let kind = match kind {
            OpKind::Acquire => 0,
            OpKind::Release => 1,
            OpKind::Grant => 2,
        };
        OpId(u64::from(handle.gen()) << 32 | kind << KIND_SHIFT | u64::from(handle.slot()))
    }

    /// What the id names, and its handle there (`None` for a number no
    /// client made).
    pub(crate) fn parts(self) -> Option<(OpKind, Handle)> {
        let low = self.0 as u32;
        let kind = match low >> KIND_SHIFT {
            0 => OpKind::Acquire,
            1 => OpKind::Release,
            2 => OpKind::Grant,
            _ => return None,
        };
        let handle = Handle::from_parts(low & ((1 << KIND_SHIFT) - 1), (self.0 >> 32) as u32);
        Some((kind, handle))
    }

    /// The number behind the id, stable for the operation's life.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts() {
            Some((kind, handle)) => {
                let kind = match kind {
                    OpKind::Acquire => "acquire",
                    OpKind::Release => "release",
                    OpKind::Grant => "grant",
                };
                write!(f, "{kind}#{}.{}", handle.slot(), handle.gen())
            }
            None => write!(f, "op#{}", self.0),
        }
    }
}

/// What the driver must do. Drained with
/// [`Client::poll_action`](super::Client::poll_action), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Open a connection to `addr`, then report
    /// [`handle_connected`](super::Client::handle_connected) or
    /// [`handle_connect_failed`](super::Client::handle_connect_failed).
    Connect {
        /// The connection's id, to quote in every input about it.
        conn: ConnId,
        /// Where to connect.
        addr: Endpoint,
    },
    /// Write `data` to the connection, all of it, in order. From the moment
    /// this action is handed out, its requests count as sent.
    Send {
        /// The connection.
        conn: ConnId,
        /// Whole frames.
        data: Bytes,
    },
    /// Close the connection (or abandon the connect attempt). Bytes that
    /// still arrive from it are ignored.
    Close {
        /// The connection.
        conn: ConnId,
    },
}

/// How a transport ended, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportEnd {
    /// The peer closed its side (end of stream).
    Eof,
    /// Reading or writing failed.
    Error,
}

/// A grant: the key is held until `valid_until` at least, as the client can
/// tell, and until it is released by its exact token. Only the client that
/// issued it takes it back ([`Client::release`](super::Client::release),
/// [`Client::undeliverable`](super::Client::undeliverable)).
///
/// Two grants are equal when they say the same (key, token, lease, times
/// and handle), whichever client issued them: the same inputs give equal
/// grants, as they give the same bytes.
#[derive(Debug, Clone)]
pub struct Grant {
    pub(crate) key: Key,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    pub(crate) valid_until: Time,
    pub(crate) expires_by: Time,
    pub(crate) handle: OpId,
    pub(crate) issuer: Issuer,
}

/// Which client issued a grant: a number no other client of the process
/// was given, drawn once per client from a counter that never wraps (2^64
/// clients), so that a grant is a plain copy for the client to hand out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Issuer(u64);

/// The issuer the next client is given.
static NEXT_ISSUER: AtomicU64 = AtomicU64::new(0);

impl Issuer {
    /// An issuer no client of this process has been given.
    pub(crate) fn new() -> Issuer {
        Issuer(NEXT_ISSUER.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether `other` is this very issuer.
    pub(crate) fn is(self, other: Issuer) -> bool {
        self == other
    }
}

impl PartialEq for Grant {
    fn eq(&self, other: &Grant) -> bool {
        let Grant {
            key,
            token,
            lease,
            valid_until,
            expires_by,
            handle,
            issuer: _,
        } = self;
        (key, token, lease, valid_until, expires_by, handle)
            == (
                &other.key,
                &other.token,
                &other.lease,
                &other.valid_until,
                &other.expires_by,
                &other.handle,
            )
    }
}

impl Eq for Grant {}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the number: the same inputs print the same text.
        f.write_str("Issuer")
    }
}

impl Grant {
    /// The key held.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token: quote it to the storage the lock protects.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease the server gave (never more than asked).
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Until when the holder could count on the grant when it was
    /// granted: the time the winning request was sent, plus how long it
    /// waited in the key's queue, plus the lease. The server started the
    /// lease no earlier than that, so this errs early, never late. Renewals
    /// move it on: [`Client::valid_until`](super::Client::valid_until) says
    /// where it is now.
    pub fn valid_until(&self) -> Time {
        self.valid_until
    }

    /// The grant's id: what the renewal notices ([`Event::Renewed`] and
    /// the others) name it by.
    pub fn id(&self) -> OpId {
        self.handle
    }

    /// By when the server has certainly freed the grant by itself: the time
    /// the answer arrived plus the lease plus the settle margin. A release
    /// makes no new attempt after this.
    pub fn expires_by(&self) -> Time {
        self.expires_by
    }
}

/// How an operation ended: exactly one per operation (invariant 1).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// `G` matched: the key is held.
    Granted(Grant),
    /// Not granted within the wait budget: a `T` answer (`sent: true`), or
    /// the acquire could not be sent in time (`sent: false`, definitive:
    /// nothing was asked).
    TimedOut {
        /// Whether a request of this acquire reached the transport.
        sent: bool,
        /// Why an acquire that was never sent could not be: how the latest
        /// connection attempt ended (a failed connect, a timeout, TLS,
        /// `no_leader`, `auth_failed`, ...). `None` when it was sent, or
        /// when no attempt had ended since the last `W`.
        cause: Option<CloseReason>,
    },
    /// The server's queue was full and the budget fits no further attempt,
    /// or the policy is fail-fast. Nothing is held.
    Busy,
    /// Cancelled before any byte of it was handed out: nothing was asked.
    Cancelled,
    /// A request was handed to the transport and no answer that can be
    /// trusted came back: the grant may or may not exist. Lease expiry
    /// settles it by `settles_by` at the latest.
    Indeterminate {
        /// When the grant, if any, has certainly expired.
        settles_by: Time,
    },
    /// `D` matched: the grant is gone.
    Released,
    /// `N` matched: no grant of that key had that token (never existed,
    /// expired, or an earlier lost attempt released it). The grant is gone.
    NotHeld,
    /// No definitive answer could be had before the release's deadline or
    /// within the shutdown budget. The grant ends by lease expiry at the
    /// latest.
    ///
    /// This is the accepted boundary of PROTOCOL.md: a server that keeps
    /// losing the answers to releases leaves those grants reported `Lapsed`
    /// although they were released. Reporting `Released` without an answer
    /// would be wrong in the far more dangerous case, a release that never
    /// arrived.
    Lapsed,
}

impl Outcome {
    /// Whether the outcome states what happened on the server (everything
    /// but [`Outcome::Indeterminate`] and [`Outcome::Lapsed`]).
    pub fn is_definitive(&self) -> bool {
        !matches!(self, Outcome::Indeterminate { .. } | Outcome::Lapsed)
    }
}

/// Why the client backs off before its next connection or attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackoffCause {
    /// Transport failure, timeout or protocol violation.
    Transport,
    /// `E no_leader`.
    NoLeader,
    /// `E not_active`.
    NotActive,
    /// `E auth_failed`.
    AuthFailed,
    /// `E unsupported_version`.
    UnsupportedVersion,
    /// Every attempt of the round ended in `M` (a redirect).
    Redirect,
    /// A `B` answer (per acquire).
    Busy,
}

/// A protocol violation by the server: the session no longer agrees with it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Violation {
    /// The bytes were not a valid frame.
    #[error("framing: {0}")]
    Framing(FrameError),
    /// A frame that only a client sends, or an answer before `W`.
    #[error("answer before W")]
    AnswerBeforeWelcome,
    /// A second `W` on one connection.
    #[error("second W")]
    SecondWelcome,
    /// An answer whose id no pending request holds (never sent, or already
    /// answered).
    #[error("answer to unknown id {id}")]
    UnknownId {
        /// The id.
        id: u64,
    },
    /// An answer whose id is pending but whose op or key differ.
    #[error("answer to id {id} names another op or key")]
    Mismatch {
        /// The id.
        id: u64,
    },
    /// A `G` with a longer lease than the acquire or renewal asked for.
    #[error("grant for id {id} has a longer lease than asked")]
    LeaseAboveAsked {
        /// The id.
        id: u64,
    },
    /// A `G` to an acquire that says it waited longer than the acquire's
    /// `wait_ms`.
    #[error("grant for id {id} waited longer than asked")]
    WaitedAboveAsked {
        /// The id.
        id: u64,
    },
    /// A `G` to an acquire without the `waited_ms` of protocol version 2.
    #[error("grant for id {id} does not say how long it waited")]
    WaitedMissing {
        /// The id.
        id: u64,
    },
    /// A `G` to a renewal whose token is not the renewal's.
    #[error("renewal of id {id} answered for another token")]
    TokenMismatch {
        /// The id.
        id: u64,
    },
}

impl Violation {
    /// A short machine-readable code, as in `protocol:<code>`.
    pub fn code(&self) -> &'static str {
        match self {
            Violation::Framing(_) => "framing",
            Violation::AnswerBeforeWelcome => "answer_before_welcome",
            Violation::SecondWelcome => "second_welcome",
            Violation::UnknownId { .. } => "unknown_id",
            Violation::Mismatch { .. } => "mismatch",
            Violation::LeaseAboveAsked { .. } => "lease_above_asked",
            Violation::WaitedAboveAsked { .. } => "waited_above_asked",
            Violation::WaitedMissing { .. } => "waited_missing",
            Violation::TokenMismatch { .. } => "token_mismatch",
        }
    }
}

/// Why a connection (or a connect attempt) ended. Its `Display` is the
/// `reason` of the CLI's `closed` event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer closed the stream.
    Eof,
    /// The transport failed.
    Io,
    /// The connect attempt failed.
    ConnectFailed,
    /// The connect attempt took longer than the connect timeout.
    ConnectTimeout,
    /// The TLS handshake of the connect attempt failed (an unknown CA, a
    /// wrong name, an expired certificate, a peer that does not speak TLS,
    /// one that stalls): the connector says why, as an atom.
    Tls(Name),
    /// No handshake answer within the handshake timeout.
    HandshakeTimeout,
    /// `M`: another node leads.
    Moved,
    /// `E no_leader`.
    NoLeader,
    /// `E not_active`.
    NotActive,
    /// `E auth_failed`.
    AuthFailed,
    /// `E unsupported_version`: the server does not speak this client's
    /// protocol version (2), and there is no fallback.
    UnsupportedVersion,
    /// Another `E` reason.
    ServerError(Name),
    /// The server broke the protocol.
    Protocol(Violation),
    /// A sent acquire was cancelled under [`CancelPolicy::Close`](super::CancelPolicy::Close).
    Cancel,
    /// A request's answer did not come within its deadline.
    AnswerTimeout,
    /// The client shut down.
    Shutdown,
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Eof => f.write_str("eof"),
            CloseReason::Io => f.write_str("io"),
            CloseReason::ConnectFailed => f.write_str("connect_failed"),
            CloseReason::ConnectTimeout => f.write_str("connect_timeout"),
            CloseReason::Tls(detail) => write!(f, "tls:{detail}"),
            CloseReason::HandshakeTimeout => f.write_str("handshake_timeout"),
            CloseReason::Moved => f.write_str("moved"),
            CloseReason::NoLeader => f.write_str("no_leader"),
            CloseReason::NotActive => f.write_str("not_active"),
            CloseReason::AuthFailed => f.write_str("auth_failed"),
            CloseReason::UnsupportedVersion => f.write_str("unsupported_version"),
            CloseReason::ServerError(reason) => write!(f, "error:{reason}"),
            CloseReason::Protocol(Violation::Framing(e)) => {
                write!(f, "protocol:framing:{}", e.code())
            }
            CloseReason::Protocol(v) => write!(f, "protocol:{}", v.code()),
            CloseReason::Cancel => f.write_str("cancel"),
            CloseReason::AnswerTimeout => f.write_str("answer_timeout"),
            CloseReason::Shutdown => f.write_str("shutdown"),
        }
    }
}

/// How a release the client issued by itself ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseResult {
    /// `D`.
    Released,
    /// `N`.
    NotHeld,
    /// No definitive answer before its deadline; lease expiry ends it.
    Lapsed,
}

/// What the embedder is told. Drained with
/// [`Client::poll_event`](super::Client::poll_event), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// An operation ended.
    Outcome {
        /// Which operation.
        op: OpId,
        /// How.
        outcome: Outcome,
    },
    /// A connection is being opened (the [`Action::Connect`] of it was just
    /// queued).
    Connecting {
        /// Where.
        addr: Endpoint,
    },
    /// A handshake was accepted.
    Connected {
        /// The server's address.
        addr: Endpoint,
        /// Its node id.
        node: Name,
        /// Its window.
        window: u64,
    },
    /// A connection, or a connect attempt, ended.
    Closed {
        /// The server's address.
        addr: Endpoint,
        /// Why.
        reason: CloseReason,
    },
    /// An allowlisted leader hint was taken: the next connection goes there.
    /// Not told again while it stays the hint.
    LeaderHint {
        /// The leader.
        addr: Endpoint,
    },
    /// A leader hint outside the allowlist was ignored. Not told again for
    /// the same address named again and again on one connection.
    HintIgnored {
        /// The address the server named.
        addr: Endpoint,
    },
    /// The server refused the credential.
    AuthFailed {
        /// The server's address.
        addr: Endpoint,
    },
    /// The server does not speak this client's protocol version.
    UnsupportedVersion {
        /// The server's address.
        addr: Endpoint,
    },
    /// A whole round of addresses refused the client (`auth_failed` or
    /// `unsupported_version`): it is misconfigured until a later `W`.
    /// Acquires waiting for a connection ended with this cause, and new
    /// ones are refused with [`Error::Misconfigured`]; releases and
    /// renewals stay queued, and the client keeps trying (backing off
    /// long).
    Misconfigured {
        /// The refusal: [`CloseReason::AuthFailed`] or
        /// [`CloseReason::UnsupportedVersion`].
        cause: CloseReason,
    },
    /// A renewal of a held grant was answered: the grant is good until
    /// `valid_until` now (the renewal's send time plus the lease it got). It
    /// ends a jeopardy.
    Renewed {
        /// The grant ([`Grant::id`]).
        grant: OpId,
        /// Its key.
        key: Key,
        /// Its token.
        token: u64,
        /// Until when the holder may count on it now.
        valid_until: Time,
    },
    /// An automatically renewed grant has less than a third of its lease
    /// left before `valid_until`: renewals went unanswered, or it arrived
    /// that late. The holder may still hold the key, but its work should be
    /// ready to stop. Told once; a later [`Event::Renewed`] ends it.
    LeaseJeopardy {
        /// The grant ([`Grant::id`]).
        grant: OpId,
        /// Its key.
        key: Key,
        /// Its token.
        token: u64,
        /// Until when the holder may still count on it.
        valid_until: Time,
    },
    /// A renewal was answered `N`: the grant is gone. Its renewal stops; a
    /// release of it ends NotHeld at once.
    LeaseLost {
        /// The grant ([`Grant::id`]).
        grant: OpId,
        /// Its key.
        key: Key,
        /// Its token.
        token: u64,
    },
    /// A held grant's `valid_until` passed: the holder can no longer count
    /// on the key (fencing tokens still protect the storage). Its renewal
    /// stops; the grant stays the holder's to release, by exact token.
    LeaseExpired {
        /// The grant ([`Grant::id`]).
        grant: OpId,
        /// Its key.
        key: Key,
        /// Its token.
        token: u64,
    },
    /// No connection (or no further attempt) before `until`.
    Backoff {
        /// Why.
        cause: BackoffCause,
        /// Until when.
        until: Time,
    },
    /// A grant nobody can take any more (an undeliverable outcome, an
    /// abandoned waiter's `G`, or a `G` no pending request claimed) was put
    /// into the release lane, to be released by its exact token.
    OrphanRelease {
        /// The key.
        key: Key,
        /// The token.
        token: u64,
    },
    /// A release the client issued by itself ended.
    OrphanSettled {
        /// The key.
        key: Key,
        /// The token.
        token: u64,
        /// How it ended.
        result: ReleaseResult,
    },
    /// The shutdown finished: every operation has its outcome, the
    /// connection is closed, and the client does nothing more.
    ShutdownComplete,
}

/// A refusal of a call, returned at once. Nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    /// The client's own capacity (open acquires or releases) is full. The
    /// operation was refused at once, without any attempt (PROTOCOL.md,
    /// "the client's own capacity is full").
    #[error("busy: the client's own capacity is full")]
    Busy,
    /// A lease of less than one millisecond.
    #[error("a lease must be at least 1 ms")]
    ZeroLease,
    /// The client is shutting down (or has shut down) and takes no new acquire.
    #[error("the client is shutting down")]
    ShuttingDown,
    /// The client has shut down and takes no new operation.
    #[error("the client has shut down")]
    Finished,
    /// Every server of the latest round refused the client
    /// ([`Event::Misconfigured`]): no new acquire is taken until one
    /// accepts it.
    #[error("every server refused this client ({0}); no acquire is taken until one accepts it")]
    Misconfigured(CloseReason),
    /// No open operation has this id (it ended, or never existed).
    #[error("no open operation {0}")]
    UnknownOperation(OpId),
    /// The grant is not held: it was already released or handed back.
    #[error("the grant of {key} with token {token} is not held any more")]
    GrantNotHeld {
        /// The key.
        key: Key,
        /// The token.
        token: u64,
    },
    /// The grant was issued by another client: only the client that
    /// issued a grant can release it or hand it back.
    #[error("the grant of {key} with token {token} was issued by another client")]
    ForeignGrant {
        /// The key.
        key: Key,
        /// The token.
        token: u64,
    },
    /// The grant's `valid_until` has passed: it is renewed no more.
    #[error("the grant of {key} with token {token} has expired")]
    LeaseExpired {
        /// The key.
        key: Key,
        /// The token.
        token: u64,
    },
}

/// The requests unanswered on the current connection
/// ([`Client::in_flight`](super::Client::in_flight)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct InFlight {
    /// Every request unanswered (at most the window).
    pub requests: usize,
    /// The acquires among them (at most the window less the reserved slots).
    pub acquires: usize,
}

/// The operations that have not ended
/// ([`Client::open_operations`](super::Client::open_operations)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OpenOperations {
    /// Acquires.
    pub acquires: usize,
    /// The embedder's releases (not those the client issues for orphaned
    /// grants).
    pub releases: usize,
}
