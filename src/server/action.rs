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
}
