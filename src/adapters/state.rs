//! A state directory (feature `server`): where `ticketing serve
//! --state-dir DIR` keeps what lets its promises outlive it (PROTOCOL.md
//! 4.1). Two files, each written whole or not at all (a temporary file,
//! synced, renamed over the old one, and the directory synced):
//!
//! - `epoch`: the [`EpochRecord`] of the latest term, written before that
//!   term's first grant;
//! - `table`: the lock table ([`TableImage`]), written on a clean stop and
//!   removed (durably) when the next start takes it, so that it is used
//!   once.
//!
//! Which term begins from them is the core's rule ([`Term::next`]); this
//! module only reads, writes and syncs.
//!
//! [`Term::next`]: crate::server::Term::next

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::server::{next_epoch, EpochRecord, ImageError, TableImage};

/// The epoch record's file name in the directory.
pub const EPOCH_FILE: &str = "epoch";

/// The table's file name in the directory.
pub const TABLE_FILE: &str = "table";

/// What went wrong with a state directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StateError {
    /// Reading, writing or syncing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The epoch file exists but is not a valid epoch record: the server
    /// must not start, since any guess could be smaller than the epoch it
    /// lost.
    #[error("{path}: not a valid epoch record ({source}); refusing to guess an epoch")]
    BadEpoch {
        /// The file.
        path: PathBuf,
        /// Why it is not valid.
        source: ImageError,
    },
}

/// A state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// The directory `dir`, made if it does not exist.
    pub fn open(dir: impl Into<PathBuf>) -> Result<StateDir, StateError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(StateDir { dir })
    }

    /// The path of the epoch file.
    pub fn epoch_path(&self) -> PathBuf {
        self.dir.join(EPOCH_FILE)
    }

    /// The path of the table file.
    pub fn table_path(&self) -> PathBuf {
        self.dir.join(TABLE_FILE)
    }

    /// The epoch record, `None` if the directory never had a term; an
    /// epoch file that cannot be read is [`StateError::BadEpoch`].
    pub fn read_epoch(&self) -> Result<Option<EpochRecord>, StateError> {
        let path = self.epoch_path();
        let Some(bytes) = read_if_there(&path)? else {
            return Ok(None);
        };
        EpochRecord::decode(&bytes)
            .map(Some)
            .map_err(|source| StateError::BadEpoch { path, source })
    }

    /// Keeps `record` durably.
    pub fn write_epoch(&self, record: &EpochRecord) -> Result<(), StateError> {
        self.write_durably(EPOCH_FILE, &record.encode())
    }

    /// Takes the table a clean stop wrote, if there is one, and removes
    /// the file (durably) so that it is used once: `Some(Err(_))` for one
    /// that is torn or truncated (a grace, then).
    pub fn take_table(&self) -> Result<Option<Result<TableImage, ImageError>>, StateError> {
        let path = self.table_path();
        let Some(bytes) = read_if_there(&path)? else {
            return Ok(None);
        };
        fs::remove_file(&path).map_err(|source| StateError::Io {
            path: path.clone(),
            source,
        })?;
        self.sync_dir()?;
        Ok(Some(TableImage::decode(&bytes)))
    }

    /// Keeps `image` durably.
    pub fn write_table(&self, image: &TableImage) -> Result<(), StateError> {
        self.write_durably(TABLE_FILE, &image.encode())
    }

    /// Writes `name` whole or not at all: a temporary file, written and
    /// synced, renamed over `name`, then the directory synced so that the
    /// rename is kept.
    fn write_durably(&self, name: &str, bytes: &[u8]) -> Result<(), StateError> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { path, source }
        };
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        file.write_all(bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        drop(file);
        let path = self.dir.join(name);
        fs::rename(&tmp, &path).map_err(io(&path))?;
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), StateError> {
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| StateError::Io {
                path: self.dir.clone(),
                source,
            })
    }
}

/// The contents of `path`, `None` if there is no such file.
fn read_if_there(path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Gives a running server the epochs it asks for
/// ([`Action::NeedEpoch`](crate::server::Action::NeedEpoch), with
/// [`EpochSource::Driver`](crate::server::EpochSource::Driver)): each
/// `max(after + 1, now in ms)`, kept first where state is kept.
pub trait Epochs: Send + 'static {
    /// The epoch after `after`, once it may be used; `None` while it may
    /// not yet (it is being kept, or keeping it failed): the server asks
    /// again on a later turn and grants nothing meanwhile.
    fn next(&mut self, after: u64) -> Option<u64>;
}

/// The epochs of a server that keeps no state: from the wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Epochs for WallClock {
    fn next(&mut self, after: u64) -> Option<u64> {
        Some(next_epoch(after, unix_now()))
    }
}

/// The epochs of a server with a state directory: each kept durably
/// before it is used, with the greatest lease of the term's record.
#[derive(Debug)]
pub struct KeptEpochs {
    /// The directory.
    pub dir: StateDir,
    /// The greatest lease a grant of the term, or one still live from
    /// before it, may have.
    pub max_lease_ms: u64,
    /// Why the latest epoch could not be kept, if it could not.
    pub failed: Option<StateError>,
}

impl Epochs for KeptEpochs {
    fn next(&mut self, after: u64) -> Option<u64> {
        let epoch = next_epoch(after, unix_now());
        let record = EpochRecord {
            epoch,
            max_lease_ms: self.max_lease_ms,
        };
        match self.dir.write_epoch(&record) {
            Ok(()) => {
                self.failed = None;
                Some(epoch)
            }
            Err(e) => {
                self.failed = Some(e);
                None
            }
        }
    }
}

/// The wall clock, since 1970 (zero before it).
pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ticketing-state-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_epoch_is_kept_and_a_bad_one_names_its_file() {
        let dir = scratch("epoch");
        let state = StateDir::open(&dir).unwrap();
        assert!(state.read_epoch().unwrap().is_none());
        let record = EpochRecord {
            epoch: 12,
            max_lease_ms: 34,
        };
        state.write_epoch(&record).unwrap();
        assert_eq!(state.read_epoch().unwrap(), Some(record));
        assert!(!dir.join("epoch.tmp").exists());
        fs::write(state.epoch_path(), b"epoch 13\n").unwrap();
        let err = state.read_epoch().unwrap_err();
        assert!(matches!(err, StateError::BadEpoch { .. }));
        assert!(err
            .to_string()
            .contains(&*state.epoch_path().to_string_lossy()));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_table_is_taken_once_and_a_torn_one_is_an_error() {
        let dir = scratch("table");
        let state = StateDir::open(&dir).unwrap();
        assert!(state.take_table().unwrap().is_none());
        let image = TableImage {
            epoch: 1,
            count: 0,
            max_lease_ms: 5,
            grace_ms: 0,
            written_at: Duration::from_millis(9),
            grants: Vec::new(),
        };
        state.write_table(&image).unwrap();
        assert_eq!(state.take_table().unwrap(), Some(Ok(image.clone())));
        assert!(state.take_table().unwrap().is_none(), "used once");
        let bytes = image.encode();
        fs::write(state.table_path(), &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(state.take_table().unwrap(), Some(Err(_))));
        assert!(!state.table_path().exists());
        fs::remove_dir_all(dir).unwrap();
    }
}
