//! File plumbing for the Raft files: the segments' names and paths, a
//! file opened as a regular file only, and writes and reads at an offset.

use std::fs::File;
use std::io;
#[cfg(not(unix))]
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::error::RaftDiskError;
use super::LOG_PREFIX;
use crate::host::state::{self, StateDir, StateError};

/// The number of the segment named `name`: only the names this module
/// gives.
pub(super) fn segment_number(name: &str) -> Option<u64> {
    let n = name.strip_prefix(LOG_PREFIX)?;
    n.parse::<u64>().ok().filter(|p| p.to_string() == n)
}

pub(super) fn segment_name(n: u64) -> String {
    format!("{LOG_PREFIX}{n}")
}

pub(super) fn segment_path(dir: &StateDir, n: u64) -> PathBuf {
    dir.path().join(segment_name(n))
}

/// Opens a Raft file that must be there, a regular file (never through a
/// link), for reading, and for writing too if `write`.
pub(super) fn open_file(path: &Path, write: bool) -> Result<File, RaftDiskError> {
    let opened = if write {
        state::open_regular_rw(path)
    } else {
        state::open_regular(path)
    };
    match opened {
        Ok(Some(file)) => Ok(file),
        Ok(None) => Err(StateError::NotRegular {
            path: path.to_path_buf(),
        }
        .into()),
        Err(source) => Err(RaftDiskError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes all of `bytes` at `at` in `file`, its cursor aside.
#[cfg(unix)]
pub(super) fn write_at(file: &File, bytes: &[u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, at)
}

#[cfg(not(unix))]
pub(super) fn write_at(mut file: &File, bytes: &[u8], at: u64) -> io::Result<()> {
    use std::io::Write as _;
    file.seek(SeekFrom::Start(at))?;
    file.write_all(bytes)
}

/// Fills `bytes` from `at` in `file`, its cursor aside.
#[cfg(unix)]
pub(super) fn read_at(file: &File, bytes: &mut [u8], at: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, bytes, at)
}

#[cfg(not(unix))]
pub(super) fn read_at(mut file: &File, bytes: &mut [u8], at: u64) -> io::Result<()> {
    file.seek(SeekFrom::Start(at))?;
    file.read_exact(bytes)
}
