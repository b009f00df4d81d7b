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
//! Which term begins from them is the core's rule ([`Term::next`], with
//! [`TableImage::check`]); this module only reads, writes and syncs, and
//! keeps the directory to one server and its owner:
//!
//! - **One server.** [`StateDir::open`] locks the file `lock` in the
//!   directory (`flock`, exclusive) for as long as the [`StateDir`] or a
//!   clone of it lives: two servers granting from one directory would
//!   grant one key twice, so a second one is refused
//!   ([`StateError::Held`]).
//! - **Private.** The directory is made `0700` and every file `0600`,
//!   whatever the umask: the table lists every key and token. A directory
//!   that others may get into (any permission bit for its group or
//!   others) is tightened to `0700` when this user owns it, and refused
//!   otherwise ([`StateError::Exposed`]); so is every regular file already
//!   in it (`0600`, or [`StateError::ExposedFile`]), whatever wrote it:
//!   an older version, a copy, a hand. Only regular files are touched,
//!   each through a descriptor opened without following a link, so that a
//!   link planted there never has its target's mode changed.
//! - **Nothing followed, nothing unbounded.** Temporaries are created
//!   anew (`O_EXCL`), so a link planted in their place is never written
//!   through; the temporaries a failed write (a full disk) left are
//!   removed when the directory is opened. A state file that is not a
//!   regular file (a link, a FIFO, a device) is refused without a byte
//!   read from it (opening a FIFO does not wait for a writer), and no
//!   read takes more than the file may hold: an epoch record's
//!   [`EpochRecord::MAX_ENCODED_LEN`], a table's [`MAX_TABLE_LEN`].
//!
//! On platforms other than Unix the lock and the permissions are not
//! enforced.
//!
//! [`Term::next`]: crate::server::Term::next

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::server::{next_epoch, EpochRecord, ImageError, TableImage, Term};

/// The epoch record's file name in the directory.
pub const EPOCH_FILE: &str = "epoch";

/// The table's file name in the directory.
pub const TABLE_FILE: &str = "table";

/// The name of the file a server locks to hold the directory.
pub const LOCK_FILE: &str = "lock";

/// The largest table a start reads: 256 MiB, a million grants of the
/// longest keys. A larger one is refused unread ([`StateError::TooLarge`])
/// and the start takes a recovery grace instead, which is always safe.
pub const MAX_TABLE_LEN: u64 = 256 << 20;

/// What went wrong with a state directory. Each names its file or
/// directory.
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
    /// The table exists but cannot be used: torn, malformed, or out of
    /// range for the epoch record ([`TableImage::check`]).
    #[error("{path}: {source}")]
    BadTable {
        /// The file.
        path: PathBuf,
        /// Why it cannot be used.
        source: ImageError,
    },
    /// Another process (another `ticketing serve`) holds the directory.
    #[error("{path}: another server holds this state directory (its file `lock` is locked); two servers on one directory would grant one key twice")]
    Held {
        /// The directory.
        path: PathBuf,
    },
    /// A state file is not a regular file (a symbolic link, a FIFO, a
    /// device): it is not opened for reading, nor written through.
    #[error("{path}: not a regular file; refusing to read it")]
    NotRegular {
        /// The file.
        path: PathBuf,
    },
    /// A state file is larger than what it may hold.
    #[error("{path}: larger than {max} bytes, the most it may hold; refusing to read it")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The most bytes it may hold.
        max: u64,
    },
    /// Others may get into the directory, and another user owns it, so it
    /// cannot be made private.
    #[error("{path}: others may get into it (mode {mode:04o}) and another user (uid {owner}) owns it, so it cannot be made private; refusing to keep locks there")]
    Exposed {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
    },
    /// A file in the directory is open to others, and another user owns
    /// it, so it cannot be made private.
    #[error("{path}: open to others (mode {mode:04o}) and another user (uid {owner}) owns it, so it cannot be made private; refusing to keep state beside it")]
    ExposedFile {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
    },
}

/// A state directory, held by this process while it (or a clone) lives.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
    /// The open lock file: the directory is held while it is open.
    _lock: Arc<File>,
}

/// The term a start begins from its state directory
/// ([`StateDir::next_term`]).
#[derive(Debug)]
#[non_exhaustive]
pub struct NextTerm {
    /// The term to begin.
    pub term: Term,
    /// Its epoch record, kept durably before the term was handed out.
    pub record: EpochRecord,
    /// A table that was there and could not be used, and why: the term
    /// then begins without it (with a recovery grace, after a term).
    pub refused_table: Option<StateError>,
}

impl StateDir {
    /// The directory `dir`, made (`0700`) if it does not exist, and held
    /// by this process: refused if another process holds it, or if others
    /// may get into it or into a file in it and another user owns that.
    /// Every regular file in it that others may read or write is made
    /// `0600` (links and other entries are left alone). Temporaries a
    /// failed write left behind are removed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<StateDir, StateError> {
        let dir = dir.into();
        sys::make_private(&dir)?;
        let lock = sys::lock(&dir)?;
        sys::make_files_private(&dir)?;
        let state = StateDir {
            dir,
            _lock: Arc::new(lock),
        };
        for name in [EPOCH_FILE, TABLE_FILE] {
            remove_if_there(&state.tmp_path(name))?;
        }
        Ok(state)
    }

    /// The path of the epoch file.
    pub fn epoch_path(&self) -> PathBuf {
        self.dir.join(EPOCH_FILE)
    }

    /// The path of the table file.
    pub fn table_path(&self) -> PathBuf {
        self.dir.join(TABLE_FILE)
    }

    /// The directory.
    #[cfg_attr(not(feature = "raft"), allow(dead_code))]
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Where `name` is written before it is put in place: its temporary,
    /// `name.tmp`.
    pub(crate) fn tmp_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.tmp"))
    }

    /// The epoch record, `None` if the directory never had a term; an
    /// epoch file that cannot be read is [`StateError::BadEpoch`] (or
    /// [`StateError::NotRegular`], [`StateError::TooLarge`]).
    pub fn read_epoch(&self) -> Result<Option<EpochRecord>, StateError> {
        let path = self.epoch_path();
        let max = EpochRecord::MAX_ENCODED_LEN as u64;
        let Some(bytes) = read_if_there(&path, max)? else {
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
    /// that cannot be used (torn, truncated, not a regular file, too
    /// large: a grace, then). `Err` if it could not even be looked at.
    pub fn take_table(&self) -> Result<Option<Result<TableImage, StateError>>, StateError> {
        let path = self.table_path();
        let read = match read_if_there(&path, MAX_TABLE_LEN) {
            Ok(None) => return Ok(None),
            Ok(Some(bytes)) => TableImage::decode(&bytes).map_err(|source| StateError::BadTable {
                path: path.clone(),
                source,
            }),
            Err(e @ (StateError::NotRegular { .. } | StateError::TooLarge { .. })) => Err(e),
            Err(e) => return Err(e),
        };
        fs::remove_file(&path).map_err(|source| StateError::Io {
            path: path.clone(),
            source,
        })?;
        self.sync_dir()?;
        Ok(Some(read))
    }

    /// Keeps `image` durably.
    pub fn write_table(&self, image: &TableImage) -> Result<(), StateError> {
        self.write_durably(TABLE_FILE, &image.encode())
    }

    /// The term a start at `now` (the wall clock, since 1970) begins from
    /// this directory (PROTOCOL.md 4.1), by the core's rule
    /// ([`Term::next`]): the epoch after the one kept, with the table a
    /// clean stop left if it is intact and in range for the epoch record
    /// ([`TableImage::check`], with `grace_margin`), else a recovery grace
    /// after any earlier term. Its epoch record (with `max_lease`, the
    /// longest lease this start gives) is kept before it is returned.
    pub fn next_term(
        &self,
        now: Duration,
        max_lease: Duration,
        grace_margin: Duration,
    ) -> Result<NextTerm, StateError> {
        let previous = self.read_epoch()?;
        let (table, refused_table) = match self.take_table()? {
            None => (None, None),
            Some(Err(refused)) => (None, Some(refused)),
            Some(Ok(image)) => match previous.map(|p| image.check(&p, grace_margin)) {
                Some(Err(source)) => {
                    let path = self.table_path();
                    (None, Some(StateError::BadTable { path, source }))
                }
                // Without a record there is nothing to check it against,
                // and no earlier term to give a grace for.
                Some(Ok(())) | None => (Some(image), None),
            },
        };
        let (term, record) = Term::next(previous.as_ref(), table, now, max_lease);
        self.write_epoch(&record)?;
        Ok(NextTerm {
            term,
            record,
            refused_table,
        })
    }

    /// Writes `name` whole or not at all: a temporary file made anew
    /// (never through a link planted in its place), written and synced,
    /// renamed over `name`, then the directory synced so that the rename
    /// is kept. A temporary left by a failed write is removed first, and
    /// one this write leaves is removed when it fails.
    pub(crate) fn write_durably(&self, name: &str, bytes: &[u8]) -> Result<(), StateError> {
        let tmp = self.write_tmp(name, bytes)?;
        let path = self.dir.join(name);
        if let Err(source) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(StateError::Io { path, source });
        }
        self.sync_dir()
    }

    /// The first half of [`StateDir::write_durably`], for a write whose
    /// file must be kept before something else is done and put in place
    /// only after: `name`'s temporary ([`StateDir::tmp_path`]) made anew,
    /// written, synced, and the directory synced, so that from then on it
    /// is there whole whatever happens. Removed if this fails. Then
    /// [`StateDir::put_in_place`].
    #[cfg_attr(not(feature = "raft"), allow(dead_code))]
    pub(crate) fn write_pending(&self, name: &str, bytes: &[u8]) -> Result<(), StateError> {
        let tmp = self.write_tmp(name, bytes)?;
        if let Err(e) = self.sync_dir() {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// The second half: `name`'s temporary renamed over `name`, and the
    /// directory synced. If this fails the temporary is left where it is,
    /// whole, for a start to find.
    #[cfg_attr(not(feature = "raft"), allow(dead_code))]
    pub(crate) fn put_in_place(&self, name: &str) -> Result<(), StateError> {
        let path = self.dir.join(name);
        fs::rename(self.tmp_path(name), &path).map_err(|source| StateError::Io { path, source })?;
        self.sync_dir()
    }

    /// `name`'s temporary made anew (a temporary a failed write left is
    /// removed first), written and synced; removed if that fails.
    fn write_tmp(&self, name: &str, bytes: &[u8]) -> Result<PathBuf, StateError> {
        let tmp = self.tmp_path(name);
        remove_if_there(&tmp)?;
        let written = sys::create_private(&tmp).and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
        if let Err(source) = written {
            let _ = fs::remove_file(&tmp);
            return Err(StateError::Io { path: tmp, source });
        }
        Ok(tmp)
    }

    pub(crate) fn sync_dir(&self) -> Result<(), StateError> {
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|source| StateError::Io {
                path: self.dir.clone(),
                source,
            })
    }
}

/// The contents of `path`, `None` if there is no such file; a file that
/// is not a regular one, or that holds more than `max` bytes, is refused
/// unread.
fn read_if_there(path: &Path, max: u64) -> Result<Option<Vec<u8>>, StateError> {
    let io = |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = match sys::open_regular(path) {
        Ok(Some(file)) => file,
        Ok(None) => {
            return Err(StateError::NotRegular {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let too_large = || StateError::TooLarge {
        path: path.to_path_buf(),
        max,
    };
    if file.metadata().map_err(io)?.len() > max {
        return Err(too_large());
    }
    // Bounded even if the file grows meanwhile.
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(Some(bytes))
}

/// Removes the file (or link) at `path` if there is one.
pub(crate) fn remove_if_there(path: &Path) -> Result<(), StateError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

// For the Raft state kept beside (`raft_disk`).
#[cfg(feature = "raft")]
pub(crate) use sys::{open_regular, open_regular_rw};

/// What the operating system is asked for: Unix, with rustix.
#[cfg(unix)]
mod sys {
    use std::fs::{self, DirBuilder, File};
    use std::io;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    use std::path::Path;

    use rustix::fs::{FlockOperation, Mode, OFlags};

    use super::{StateError, LOCK_FILE};

    /// The directory's mode and its files': this user's alone.
    const PRIVATE_DIR: u32 = 0o700;
    const PRIVATE_FILE: u32 = 0o600;
    /// The bits that let others in.
    const OTHERS: u32 = 0o077;

    fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
        move |source| StateError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Makes `dir` (and its parents) `0700` if it is not there; tightens
    /// it to `0700` if others may get in and this user owns it; refuses
    /// it if others may get in and another user owns it.
    pub(super) fn make_private(dir: &Path) -> Result<(), StateError> {
        DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR)
            .create(dir)
            .map_err(io_error(dir))?;
        let meta = fs::metadata(dir).map_err(io_error(dir))?;
        let mode = meta.mode() & 0o7777;
        if mode & OTHERS == 0 {
            return Ok(());
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(StateError::Exposed {
                path: dir.to_path_buf(),
                mode,
                owner: meta.uid(),
            });
        }
        // Made under a lax umask, or by hand: this user's, so tightened.
        fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR)).map_err(io_error(dir))
    }

    /// Makes every regular file in `dir` that others may read or write
    /// `0600` when this user owns it, and refuses the first one another
    /// user owns. Nothing is followed: an entry is looked at with `lstat`,
    /// and only a regular file is opened (`O_NOFOLLOW`, never blocking,
    /// never a controlling terminal), then judged again through its
    /// descriptor and changed with `fchmod` on it, so that a link or a
    /// file swapped in meanwhile never has another file's mode changed.
    pub(super) fn make_files_private(dir: &Path) -> Result<(), StateError> {
        let me = rustix::process::geteuid().as_raw();
        for entry in fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            let meta = match fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                // Gone meanwhile: nothing to make private.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&path)(e)),
            };
            if !exposed_file(&path, &meta, me)? {
                continue;
            }
            let Some(file) = open_to_chmod(&path)? else {
                continue;
            };
            let meta = file.metadata().map_err(io_error(&path))?;
            if exposed_file(&path, &meta, me)? {
                rustix::fs::fchmod(&file, Mode::from_raw_mode(PRIVATE_FILE))
                    .map_err(|e| io_error(&path)(e.into()))?;
            }
        }
        Ok(())
    }

    /// Whether `meta` is a regular file that others may read or write and
    /// this user (`me`) owns, so that it is to be tightened; refused if
    /// another user owns it.
    fn exposed_file(path: &Path, meta: &fs::Metadata, me: u32) -> Result<bool, StateError> {
        let mode = meta.mode() & 0o7777;
        if !meta.file_type().is_file() || mode & OTHERS == 0 {
            return Ok(false);
        }
        if meta.uid() != me {
            return Err(StateError::ExposedFile {
                path: path.to_path_buf(),
                mode,
                owner: meta.uid(),
            });
        }
        Ok(true)
    }

    /// `path` opened so that `fchmod` may be called on it, never through
    /// a link: for reading, or for writing if its owner may not read it.
    /// `None` if it became a link or went away meanwhile.
    fn open_to_chmod(path: &Path) -> Result<Option<File>, StateError> {
        let flags = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let mut opened = rustix::fs::open(path, flags | OFlags::RDONLY, Mode::empty());
        if matches!(opened, Err(rustix::io::Errno::ACCESS)) {
            opened = rustix::fs::open(path, flags | OFlags::WRONLY, Mode::empty());
        }
        match opened {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(io_error(path)(e.into())),
        }
    }

    /// Opens and locks the lock file of `dir`, for as long as the file
    /// is open.
    pub(super) fn lock(dir: &Path) -> Result<File, StateError> {
        let path = dir.join(LOCK_FILE);
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&path, flags, Mode::from_raw_mode(PRIVATE_FILE))
            .map_err(|e| io_error(&path)(e.into()))?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(File::from(fd)),
            Err(rustix::io::Errno::WOULDBLOCK) => Err(StateError::Held {
                path: dir.to_path_buf(),
            }),
            Err(e) => Err(io_error(&path)(e.into())),
        }
    }

    /// Opens `path` for reading if it is a regular file; `Ok(None)` if it
    /// is something else. Links are not followed, and a FIFO does not
    /// block the open.
    pub(crate) fn open_regular(path: &Path) -> io::Result<Option<File>> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let file = match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            // What O_NOFOLLOW says of a link.
            Err(rustix::io::Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(file.metadata()?.is_file().then_some(file))
    }

    /// Opens `path` for reading and writing (not appending) if it is a
    /// regular file; `Ok(None)` if it is something else. Links are not
    /// followed.
    #[cfg_attr(not(feature = "raft"), allow(dead_code))]
    pub(crate) fn open_regular_rw(path: &Path) -> io::Result<Option<File>> {
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let file = match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(rustix::io::Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(file.metadata()?.is_file().then_some(file))
    }

    /// Creates `path` anew (never through what is there, a link
    /// included), `0600` whatever the umask, for writing.
    pub(super) fn create_private(path: &Path) -> io::Result<File> {
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::from_raw_mode(PRIVATE_FILE))?;
        // The umask may have taken bits off, never added any: exact now.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(PRIVATE_FILE))?;
        Ok(File::from(fd))
    }
}

/// What the operating system is asked for elsewhere: the files alone,
/// with neither the lock nor the permissions.
#[cfg(not(unix))]
mod sys {
    use std::fs::{self, File, OpenOptions};
    use std::io;
    use std::path::Path;

    use super::StateError;

    pub(super) fn make_private(dir: &Path) -> Result<(), StateError> {
        fs::create_dir_all(dir).map_err(|source| StateError::Io {
            path: dir.to_path_buf(),
            source,
        })
    }

    pub(super) fn make_files_private(_dir: &Path) -> Result<(), StateError> {
        Ok(())
    }

    pub(super) fn lock(dir: &Path) -> Result<File, StateError> {
        File::open(dir).map_err(|source| StateError::Io {
            path: dir.to_path_buf(),
            source,
        })
    }

    pub(crate) fn open_regular(path: &Path) -> io::Result<Option<File>> {
        if !fs::symlink_metadata(path)?.is_file() {
            return Ok(None);
        }
        File::open(path).map(Some)
    }

    #[cfg_attr(not(feature = "raft"), allow(dead_code))]
    pub(crate) fn open_regular_rw(path: &Path) -> io::Result<Option<File>> {
        if !fs::symlink_metadata(path)?.is_file() {
            return Ok(None);
        }
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map(Some)
    }

    pub(super) fn create_private(path: &Path) -> io::Result<File> {
        OpenOptions::new().write(true).create_new(true).open(path)
    }
}

/// Gives a running server the epochs it asks for
/// ([`Action::NeedEpoch`](crate::server::Action::NeedEpoch), with
/// [`EpochSource::Driver`](crate::server::EpochSource::Driver)): each
/// `max(after + 1, now in ms)`, kept first where state is kept.
pub trait Epochs: Send + 'static {
    /// The epoch after `after`, once it may be used; `None` while it may
    /// not yet (it is being kept, or keeping it failed): the server asks
    /// again on every later turn (at least every [`EPOCH_RETRY`] while it
    /// waits) and grants nothing meanwhile. It may ask often: an
    /// implementation whose tries cost I/O spaces them out itself.
    fn next(&mut self, after: u64) -> Option<u64>;
}

/// How often a server that waits for an epoch asks again, at least, and
/// how often [`KeptEpochs`] tries again to keep one after a failure.
pub const EPOCH_RETRY: Duration = Duration::from_millis(100);

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
///
/// A term about to reach `n = 2^22` needs one (PROTOCOL.md 4.1). If it
/// cannot be kept (a full disk, a directory made read-only), the server
/// grants nothing until it can: it is tried again every [`EPOCH_RETRY`],
/// and every failure, and the success that ends them, is told to the
/// watcher given to [`KeptEpochs::watch`] (`ticketing serve` says so on
/// stderr and counts them).
pub struct KeptEpochs {
    dir: StateDir,
    max_lease_ms: u64,
    /// Tries that failed since the latest epoch kept.
    failures: u64,
    /// No try before then, after a failure.
    retry_at: Option<Instant>,
    watch: Box<dyn FnMut(Keeping<'_>) + Send>,
}

/// What came of keeping an epoch, as [`KeptEpochs`] tells its watcher.
#[derive(Debug)]
#[non_exhaustive]
pub enum Keeping<'a> {
    /// `epoch` could not be kept: nothing is granted until a later try
    /// keeps one.
    Failed {
        /// The epoch that was to be kept.
        epoch: u64,
        /// Why it could not be.
        error: &'a StateError,
        /// Tries failed in a row, this one included.
        failures: u64,
    },
    /// `epoch` was kept after tries that failed: the server grants again.
    Recovered {
        /// The epoch kept.
        epoch: u64,
        /// The tries that failed before.
        failures: u64,
    },
}

impl KeptEpochs {
    /// The epochs of `dir`, each kept with `max_lease_ms` (the greatest
    /// lease a grant of the term, or one still live from before it, may
    /// have: the record's of the term that began).
    pub fn new(dir: StateDir, max_lease_ms: u64) -> KeptEpochs {
        KeptEpochs {
            dir,
            max_lease_ms,
            failures: 0,
            retry_at: None,
            watch: Box::new(|_| {}),
        }
    }

    /// Tells `watch` what comes of each try that fails, and of the one
    /// that works after them. It is called on the server's task: it
    /// should only take note, never block.
    pub fn watch(mut self, watch: impl FnMut(Keeping<'_>) + Send + 'static) -> KeptEpochs {
        self.watch = Box::new(watch);
        self
    }
}

impl std::fmt::Debug for KeptEpochs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptEpochs")
            .field("dir", &self.dir)
            .field("max_lease_ms", &self.max_lease_ms)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl Epochs for KeptEpochs {
    fn next(&mut self, after: u64) -> Option<u64> {
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return None;
        }
        let epoch = next_epoch(after, unix_now());
        let record = EpochRecord {
            epoch,
            max_lease_ms: self.max_lease_ms,
        };
        match self.dir.write_epoch(&record) {
            Ok(()) => {
                if self.failures > 0 {
                    let failures = std::mem::take(&mut self.failures);
                    (self.watch)(Keeping::Recovered { epoch, failures });
                }
                self.retry_at = None;
                Some(epoch)
            }
            Err(error) => {
                self.failures += 1;
                self.retry_at = Instant::now().checked_add(EPOCH_RETRY);
                (self.watch)(Keeping::Failed {
                    epoch,
                    error: &error,
                    failures: self.failures,
                });
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
        assert!(matches!(state.take_table().unwrap(), Some(Ok(taken)) if taken == image));
        assert!(state.take_table().unwrap().is_none(), "used once");
        let bytes = image.encode();
        fs::write(state.table_path(), &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(
            state.take_table().unwrap(),
            Some(Err(StateError::BadTable { .. }))
        ));
        assert!(!state.table_path().exists());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_directory_is_held_by_one_state_dir_and_its_clones() {
        let dir = scratch("held");
        let state = StateDir::open(&dir).unwrap();
        let clone = state.clone();
        drop(state);
        let err = StateDir::open(&dir).unwrap_err();
        assert!(matches!(err, StateError::Held { .. }), "{err}");
        assert!(err.to_string().contains(&*dir.to_string_lossy()), "{err}");
        drop(clone);
        StateDir::open(&dir).expect("free once every clone is gone");
        fs::remove_dir_all(dir).unwrap();
    }

    #[cfg(unix)]
    fn mode_of(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[cfg(unix)]
    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Files left open to others (by an older version, a copy, a hand)
    /// are made private when the directory is opened; a link planted
    /// among them does not get its target changed, nor does anything
    /// that is not a regular file, nor a file already private.
    #[cfg(unix)]
    #[test]
    fn files_open_to_others_are_made_private_and_links_are_not_followed() {
        let dir = scratch("modes");
        drop(StateDir::open(&dir).unwrap());
        let outside = scratch("modes-outside");
        fs::create_dir_all(&outside).unwrap();
        let target = outside.join("not-ours-to-change");
        fs::write(&target, b"elsewhere").unwrap();
        set_mode(&target, 0o666);
        let loose = [
            LOCK_FILE,
            EPOCH_FILE,
            TABLE_FILE,
            "raft-log.0",
            "raft-snapshot",
            "raft-log.1.tmp",
        ];
        for name in loose {
            fs::write(dir.join(name), b"x").unwrap();
            set_mode(&dir.join(name), 0o666);
        }
        fs::write(dir.join("read-only"), b"x").unwrap();
        set_mode(&dir.join("read-only"), 0o400);
        std::os::unix::fs::symlink(&target, dir.join("raft-log.7")).unwrap();
        fs::create_dir(dir.join("a-directory")).unwrap();
        set_mode(&dir.join("a-directory"), 0o755);

        let state = StateDir::open(&dir).unwrap();
        for name in loose {
            assert_eq!(mode_of(&dir.join(name)), 0o600, "{name}");
        }
        assert_eq!(mode_of(&dir.join("read-only")), 0o400, "never loosened");
        assert_eq!(mode_of(&target), 0o666, "a link's target is left alone");
        assert_eq!(mode_of(&dir.join("a-directory")), 0o755);
        drop(state);
        fs::remove_dir_all(dir).unwrap();
        fs::remove_dir_all(outside).unwrap();
    }

    /// A file open to others that another user owns cannot be made
    /// private: refused, naming it, as the directory itself would be. One
    /// that is private already is left as it is. (Only root can give a
    /// file away, so only root runs this.)
    #[cfg(unix)]
    #[test]
    fn a_file_open_to_others_that_another_user_owns_is_refused() {
        if rustix::process::geteuid().as_raw() != 0 {
            return;
        }
        let dir = scratch("modes-owner");
        drop(StateDir::open(&dir).unwrap());
        let theirs = dir.join("raft-snapshot");
        fs::write(&theirs, b"x").unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        set_mode(&theirs, 0o600);
        drop(StateDir::open(&dir).expect("private already"));
        assert_eq!(mode_of(&theirs), 0o600);
        set_mode(&theirs, 0o644);
        let err = StateDir::open(&dir).unwrap_err();
        assert!(matches!(err, StateError::ExposedFile { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&*theirs.to_string_lossy()), "{text}");
        assert!(text.contains("0644") && text.contains("4242"), "{text}");
        assert_eq!(mode_of(&theirs), 0o644, "left as it was");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_failure_to_keep_an_epoch_is_told_and_so_is_the_end_of_them() {
        use std::sync::Mutex;

        let dir = scratch("kept");
        let state = StateDir::open(&dir).unwrap();
        // A directory where the record goes: the rename over it fails,
        // whoever runs the test (root included).
        fs::create_dir_all(state.epoch_path().join("in-the-way")).unwrap();
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&told);
        let mut epochs = KeptEpochs::new(state.clone(), 5_000).watch(move |keeping| {
            let line = match keeping {
                Keeping::Failed {
                    error, failures, ..
                } => format!("failed {failures}: {error}"),
                Keeping::Recovered { epoch, failures } => {
                    format!("kept {epoch} after {failures}")
                }
            };
            seen.lock().unwrap().push(line);
        });
        assert_eq!(epochs.next(7), None);
        assert_eq!(epochs.next(7), None, "too soon to try again");
        std::thread::sleep(EPOCH_RETRY);
        assert_eq!(epochs.next(7), None);
        {
            let told = told.lock().unwrap();
            assert_eq!(told.len(), 2, "{told:?}");
            let epoch = state.epoch_path();
            assert!(told[0].starts_with("failed 1: "), "{told:?}");
            assert!(told[1].starts_with("failed 2: "), "{told:?}");
            assert!(told[1].contains(&*epoch.to_string_lossy()), "{told:?}");
        }
        fs::remove_dir_all(state.epoch_path()).unwrap();
        std::thread::sleep(EPOCH_RETRY);
        let epoch = epochs.next(7).expect("kept now");
        assert!(epoch > 7);
        assert_eq!(
            told.lock().unwrap().last().unwrap(),
            &format!("kept {epoch} after 2")
        );
        let record = state.read_epoch().unwrap().unwrap();
        assert_eq!((record.epoch, record.max_lease_ms), (epoch, 5_000));
        fs::remove_dir_all(dir).unwrap();
    }
}
