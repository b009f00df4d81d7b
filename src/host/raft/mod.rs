//! A replicated cluster (PROTOCOL.md 4.3, feature `raft`): what
//! `ticketing serve --raft-id` runs, the core and its host in one place.
//!
//! | item | layer | what |
//! |---|---|---|
//! | [`Replica`] | core, sans-IO (`server::raft`) | the server core beside a raft-rs `RawNode`: decisions replicated, answers held until committed, a committed copy of the table on every member, a peer's messages screened |
//! | [`RaftDisk`] | host (`disk/`) | the member's Raft state in its state directory, one write and one sync per `Ready` |
//! | [`Peers`] | host, tokio (`peers.rs`) | the authenticated links between members |
//! | [`write_backup`], [`read_backup`] | host (`backup_file.rs`) | a backup's file, written whole or not at all |
//! | [`spawn_member`] | host, tokio (`serve.rs`) | a member served on a listener, as `ticketing::serve` serves a single server |

mod backup_file;
mod disk;
mod hello;
mod peers;
mod record;
mod serve;

pub use self::backup_file::*;
pub use self::disk::*;
pub use self::peers::*;
pub use self::serve::*;
pub use crate::server::raft::*;
