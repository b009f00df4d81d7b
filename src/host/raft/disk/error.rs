//! What goes wrong with the Raft state ([`RaftDiskError`]), and what a
//! start cuts off and says ([`DroppedTail`], [`Torn`]); with the two
//! helpers that turn a failed read or write, or a record too long, into
//! an error naming its file.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::host::raft::record::{TooLarge, MAX_RECORD_LEN};
use crate::host::state::StateError;

/// What went wrong with the Raft state. Each names its file or directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RaftDiskError {
    /// The state directory or one of its files: held by another process,
    /// open to others, not a regular file, or a failed write (see
    /// [`StateError`]).
    #[error(transparent)]
    State(#[from] StateError),
    /// Reading, writing or syncing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// A new cluster was asked for on a directory that holds Raft state.
    #[error("{path}: holds Raft state already ({found}); a new cluster begins only on state directories with none, so refusing to start one here")]
    NotEmpty {
        /// The directory.
        path: PathBuf,
        /// A Raft file in it.
        found: PathBuf,
    },
    /// A member of an existing cluster was asked for on a directory that
    /// holds no Raft state.
    #[error("{path}: holds no Raft state, and the cluster is not new; refusing to start a member that forgot its votes (it could elect two leaders in one term)")]
    NoState {
        /// The directory.
        path: PathBuf,
    },
    /// The member whose directory it is was removed from its cluster
    /// (PROTOCOL.md 4.4, "Removing"), and said so here.
    #[error("{path}: this member was removed from its cluster; it never starts again from this directory (a member that comes back is a new one: a new id, an empty directory, --raft-join)")]
    Removed {
        /// The record of its removal.
        path: PathBuf,
    },
    /// The directory holds another member's Raft state.
    #[error("{path}: this state directory is member {recorded}'s; refusing to start it as member {member}")]
    NotMine {
        /// The directory.
        path: PathBuf,
        /// The member its segments were written for.
        recorded: u64,
        /// The member it was to be started as.
        member: u64,
    },
    /// What is on disk cannot be read whole.
    #[error("{path}: at byte {offset}: {why}; refusing to start from Raft state that cannot be read whole (a member that forgot its votes could elect two leaders in one term, one that forgot entries it acknowledged could help undo a commit)")]
    Corrupt {
        /// The file (or the directory, for what is missing from it).
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// A record would be longer than [`MAX_RECORD_LEN`]: nothing written.
    #[error(
        "{path}: a record of {len} bytes, more than the {max} a record may hold; nothing written"
    )]
    TooLarge {
        /// The file it was for.
        path: PathBuf,
        /// Its payload's length.
        len: u64,
        /// [`MAX_RECORD_LEN`].
        max: u64,
    },
    /// What was to be written would not read back as a log (entries that
    /// leave a gap, a commit past the last entry, a snapshot without its
    /// configuration, another cluster's identity): nothing written.
    #[error("{path}: {why}; nothing written")]
    Refused {
        /// The file it was for.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An earlier write or sync failed: what the file holds is not known,
    /// so nothing more is written to it.
    #[error("{path}: an earlier write or sync failed, so what it holds is not known; nothing more is written until a start reads it again")]
    Failed {
        /// The newest segment.
        path: PathBuf,
    },
}

/// A tail cut off the newest segment at start: bytes that were never
/// synced (a write a crash tore, never acknowledged). Said, never silent:
/// its `Display` is a line for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DroppedTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the tail began.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
    /// The whole records it held (a record cut short is none).
    pub records: u64,
    /// What it was.
    pub what: Torn,
    /// Whether a witness said where what was synced ends (else the segment
    /// is from before headers, and only its last record could go).
    pub witnessed: bool,
}

/// What a [`DroppedTail`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Torn {
    /// A record cut short: a write cut by a crash.
    CutShort,
    /// A whole last record failing its checksum: a write torn by a crash.
    BadChecksum,
    /// Zeros, what a crash may leave past a file's last write.
    Zeros,
    /// A seal that its slot never said: a compaction cut short, which a
    /// later one does again.
    Seal,
}

impl fmt::Display for Torn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Torn::CutShort => "a record cut short",
            Torn::BadChecksum => "a whole record failing its checksum",
            Torn::Zeros => "zeros",
            Torn::Seal => "a seal whose compaction was cut short",
        })
    }
}

impl fmt::Display for DroppedTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DroppedTail {
            path,
            offset,
            bytes,
            what,
            ..
        } = self;
        let path = path.display();
        if self.witnessed {
            write!(
                f,
                "{path}: dropped {bytes} bytes at offset {offset} beyond what was synced ({what})"
            )
        } else {
            write!(
                f,
                "{path}: dropped {bytes} bytes at offset {offset}, a torn last record of a segment from before segments recorded what was synced ({what})"
            )
        }
    }
}

pub(super) fn too_large(path: &Path, TooLarge(len): TooLarge) -> RaftDiskError {
    RaftDiskError::TooLarge {
        path: path.to_path_buf(),
        len,
        max: MAX_RECORD_LEN,
    }
}

pub(super) fn io_error(path: &Path) -> impl FnOnce(io::Error) -> RaftDiskError + '_ {
    move |source| RaftDiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}
