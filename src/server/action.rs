//! What the server core hands out: connection ids and actions.
use bytes::Bytes;

crate::conn_id::conn_id! {
    /// Names one connection accepted by a [`Server`](super::Server). Ids are
    /// handed out by [`Server::handle_accept`](super::Server::handle_accept),
    /// 1 for the first connection and then up, and never reused by that server.
    ConnId
}

/// What the driver must do. Drained with
/// [`Server::poll_action`](super::Server::poll_action), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Write `data` to the connection, all of it, in order. It holds whole
    /// frames: everything the server said to that connection since its last
    /// `Send`, so several answers may come in one.
    Send {
        /// The connection.
        conn: ConnId,
        /// Whole frames, each ending in `\n`.
        data: Bytes,
    },
    /// Close the connection once the `Send`s before this action are written.
    /// The server has forgotten it: bytes that still arrive from it are
    /// ignored, and its waiting acquires are dropped (its grants stay).
    Close {
        /// The connection.
        conn: ConnId,
    },
    /// The term's counter is about to reach 2^22 and the configuration
    /// says the driver gives epochs ([`EpochSource::Driver`](super::EpochSource::Driver)):
    /// give the next one, greater than `after` (PROTOCOL.md 4.1:
    /// `max(after + 1, now in ms)`, stored durably first by a driver that
    /// keeps state), with [`Server::begin_epoch`](super::Server::begin_epoch).
    /// Nothing is granted until then; acquires queue as usual.
    NeedEpoch {
        /// The current epoch.
        after: u64,
    },
}
