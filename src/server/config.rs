//! The server's configuration and its role in the cluster.

use core::time::Duration;

use thiserror::Error;

use super::term::EpochSource;
use crate::names::{Endpoint, Name};

/// What this node is, as far as handshakes are concerned (PROTOCOL.md
/// section 4, rule 7).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// This node leads: it accepts handshakes with `W` and serves requests.
    Leader,
    /// Another node leads: a handshake is answered `M <leader>` and closed.
    Follower {
        /// The node that leads.
        leader: Endpoint,
    },
    /// No node is known to lead: a handshake is answered `E no_leader` and
    /// closed.
    NoLeader,
    /// This node is starting up or draining: a handshake is answered
    /// `E not_active` and closed.
    NotActive,
}

impl Role {
    /// Whether this role accepts handshakes and serves requests.
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader)
    }
}

/// Everything the server core is told when it is made. Build one with
/// [`Config::new`] and change the fields you need; the fields match the
/// options of `ticketing serve` (CLI.md).
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// Sent in `W <node-id> <window>`.
    pub node_id: Name,
    /// How many requests a client may have unanswered on one connection
    /// (sent in `W`; at least 2; default 64). One more is answered
    /// `E window` and the connection is closed (rule 6).
    pub window: u64,
    /// Most acquires waiting in one key's queue (default 1024). The holder
    /// is not counted. An acquire that would wait beyond it is answered `B`.
    pub queue_limit: usize,
    /// Most acquires waiting in all queues together (default 65 536). The
    /// holders are not counted. An acquire that would wait beyond it is
    /// answered `B`.
    pub max_waiters: usize,
    /// The longest lease granted (default 60 s, at least 1 ms): a grant's
    /// lease is `min(lease_ms, max_lease)` in whole milliseconds (rule 3).
    pub max_lease: Duration,
    /// The credential clients must present in `H`. `None` (the default)
    /// accepts any credential, `-` included. With `Some`, a different
    /// credential, or `-`, is answered `E auth_failed` (rule 8).
    pub credential: Option<Name>,
    /// The role the node starts in (default [`Role::Leader`]); change it at
    /// run time with [`Server::set_role`](super::Server::set_role).
    pub role: Role,
    /// Sent as `L <addr>` right after every `W` (default none). Replaced by
    /// [`Server::announce_leader`](super::Server::announce_leader).
    pub leader_hint: Option<Endpoint>,
    /// How long a connection may take to send a complete `H` after it was
    /// accepted (default 10 s). One that has not by then is sent
    /// `E handshake_timeout` and closed (rule 10), so that connections that
    /// never speak cannot pile up. Any positive duration is allowed; one so
    /// long that the deadline lies beyond [`Time::MAX`](crate::Time::MAX)
    /// (584 years after the driver's origin) never fires. Zero is refused
    /// ([`ConfigError::HandshakeTimeoutZero`]): it would close every
    /// connection at its accept, before any byte could arrive.
    pub handshake_timeout: Duration,
    /// How many bytes of a connection's answers may wait to be written to
    /// its transport before the server stops reading from it (rule 10;
    /// default 256 KiB): [`Server::is_reading`](super::Server::is_reading)
    /// turns false there and true again at half of it. A client that keeps
    /// to its window never gets near it (64 answers of at most 1024 bytes
    /// are 64 KiB). At least 1024 bytes (one frame), else
    /// [`ConfigError::MaxUnwrittenTooSmall`].
    pub max_unwritten: usize,
    /// The secret key of the lock table's hashing (default 0). Clients
    /// choose the keys: a server open to clients it does not trust sets
    /// this from entropy, as `ticketing serve` does, so that nobody can
    /// pick keys that collide. The core draws no entropy itself: the same
    /// configuration gives the same server.
    pub hash_key: u128,
    /// The margin of a recovery grace (PROTOCOL.md 4.1, default 1 s): a
    /// term begun without the previous term's table
    /// ([`Term::Recovered`](super::Term::Recovered)) grants nothing for
    /// the greatest earlier lease plus this, so that every earlier grant
    /// has run out or been reclaimed first, clock drift within it.
    pub grace_margin: Duration,
    /// Where the epoch of a term the core begins by itself (when a term's
    /// counter reaches 2^22) comes from (default [`EpochSource::Core`]).
    pub epochs: EpochSource,
}

/// Every field, the secrets (`credential`, `hash_key`) left out.
impl core::fmt::Debug for Config {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Config")
            .field("node_id", &self.node_id)
            .field("window", &self.window)
            .field("queue_limit", &self.queue_limit)
            .field("max_waiters", &self.max_waiters)
            .field("max_lease", &self.max_lease)
            .field("credential", &self.credential.as_ref().map(|_| "<secret>"))
            .field("role", &self.role)
            .field("leader_hint", &self.leader_hint)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_unwritten", &self.max_unwritten)
            .field("grace_margin", &self.grace_margin)
            .field("epochs", &self.epochs)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// A leader named `node_id` with the default limits.
    pub fn new(node_id: Name) -> Config {
        Config {
            node_id,
            window: 64,
            queue_limit: 1024,
            max_waiters: 65_536,
            max_lease: Duration::from_secs(60),
            credential: None,
            role: Role::Leader,
            leader_hint: None,
            handshake_timeout: Duration::from_secs(10),
            max_unwritten: 256 * 1024,
            hash_key: 0,
            grace_margin: Duration::from_secs(1),
            epochs: EpochSource::Core,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.window < 2 {
            return Err(ConfigError::WindowTooSmall {
                window: self.window,
            });
        }
        if self.max_lease < Duration::from_millis(1) {
            return Err(ConfigError::MaxLeaseTooShort);
        }
        if self.credential.as_ref().is_some_and(|c| c.as_str() == "-") {
            return Err(ConfigError::DashCredential);
        }
        if self.handshake_timeout.is_zero() {
            return Err(ConfigError::HandshakeTimeoutZero);
        }
        if self.max_unwritten < crate::wire::MAX_FRAME {
            return Err(ConfigError::MaxUnwrittenTooSmall {
                max_unwritten: self.max_unwritten,
            });
        }
        Ok(())
    }

    /// `max_lease` in whole milliseconds (at least 1 once validated).
    pub(crate) fn max_lease_ms(&self) -> u64 {
        crate::time::duration_millis(self.max_lease).max(1)
    }
}

/// Why a [`Config`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `W` announces a window of at least 2.
    #[error("window must be at least 2, got {window}")]
    WindowTooSmall {
        /// The window configured.
        window: u64,
    },
    /// A lease is at least 1 ms, so the maximum must be too.
    #[error("max_lease must be at least 1 ms")]
    MaxLeaseTooShort,
    /// `-` on the wire means "no credential": it cannot be the one required.
    #[error("the credential cannot be \"-\" (it means no credential)")]
    DashCredential,
    /// A handshake timeout of zero would close every connection before its
    /// first byte.
    #[error("handshake_timeout must be positive, got 0")]
    HandshakeTimeoutZero,
    /// `max_unwritten` must hold one frame at least.
    #[error("max_unwritten must be at least 1024 bytes, got {max_unwritten}")]
    MaxUnwrittenTooSmall {
        /// The value configured.
        max_unwritten: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new(Name::new("n1").unwrap())
    }

    #[test]
    fn validation_refuses_what_the_protocol_cannot_say() {
        assert_eq!(config().validate(), Ok(()));
        let mut c = config();
        c.window = 1;
        assert_eq!(c.validate(), Err(ConfigError::WindowTooSmall { window: 1 }));
        let mut c = config();
        c.max_lease = Duration::from_micros(999);
        assert_eq!(c.validate(), Err(ConfigError::MaxLeaseTooShort));
        let mut c = config();
        c.credential = Some(Name::new("-").unwrap());
        assert_eq!(c.validate(), Err(ConfigError::DashCredential));
        let mut c = config();
        c.handshake_timeout = Duration::ZERO;
        assert_eq!(c.validate(), Err(ConfigError::HandshakeTimeoutZero));
        assert!(ConfigError::HandshakeTimeoutZero
            .to_string()
            .contains("handshake_timeout"));
        let mut c = config();
        c.handshake_timeout = Duration::from_nanos(1);
        assert_eq!(c.validate(), Ok(()));
        c.handshake_timeout = Duration::MAX;
        assert_eq!(c.validate(), Ok(()));
        let mut c = config();
        c.max_unwritten = 1023;
        assert_eq!(
            c.validate(),
            Err(ConfigError::MaxUnwrittenTooSmall {
                max_unwritten: 1023
            })
        );
        c.max_unwritten = 1024;
        assert_eq!(c.validate(), Ok(()));
        let mut c = config();
        c.max_lease = Duration::from_micros(2_500);
        assert_eq!(c.max_lease_ms(), 2);
    }
}
