//! The server host: everything between sockets or a disk and the server
//! cores ([`Server`](crate::server::Server), and a replicated cluster's
//! [`Replica`](crate::server::raft::Replica)), on tokio. Each part is
//! behind its cargo feature and re-exported at the crate root
//! (`ticketing::serve`, `ticketing::state`, `ticketing::cluster`,
//! `ticketing::raft`).
//!
//! No rule of the protocol lives here: the host moves bytes between
//! sockets or files and the cores. What it encodes itself, a replicated
//! member's peer hello and its log's records, is sans-IO beside the I/O
//! that carries it (`raft::hello`, `raft::record`). It never imports the
//! client runtime (`crate::runtime`), nor the runtime it.
//!
//! | module | what |
//! |---|---|
//! | `serve` | the serving task: a core on a listener (TCP, or TLS) |
//! | `core` | what the serving task drives, and the commands each kind of core takes |
//! | `tls` | the TLS listener (feature `tls`) |
//! | `state` | a state directory: the epoch and the table, kept durably |
//! | `etcd` | a node of a cluster on etcd: leadership and epochs (feature `etcd`) |
//! | `raft` | a member of a replicated cluster: its state directory, its peer links, its serving task (feature `raft`) |

mod core;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "raft")]
pub mod raft;
pub mod serve;
pub mod state;
#[cfg(feature = "tls")]
mod tls;
