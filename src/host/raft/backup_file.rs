//! A backup's file (PROTOCOL.md 4.4, "Backup and restore"; the format is
//! [`Backup`]'s): written as a temporary beside it, synced, renamed over
//! it and the directory synced, so that a crash leaves the old file or the
//! new one, never part of one; read back whole or refused.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::server::raft::{Backup, BackupError};

/// Why a backup's file could not be written or read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BackupFileError {
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// The file, or its temporary.
        path: PathBuf,
        /// What it said.
        source: io::Error,
    },
    /// The file is not a whole backup.
    #[error("{path}: not a backup ticketing wrote: {source}")]
    Backup {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: BackupError,
    },
}

/// Writes `backup` to `path`: a temporary in the same directory, made
/// anew (never through a file or link already there) and readable by its
/// owner only, written and synced, then renamed over `path`, and the
/// directory synced.
pub fn write_backup(path: &Path, backup: &Backup) -> Result<(), BackupFileError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| BackupFileError::Io { path, source }
    };
    let name = path.file_name().ok_or_else(|| {
        io(path)(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut file| {
        file.write_all(&backup.encode())?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(io(path)(e));
    }
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Reads the backup at `path`.
pub fn read_backup(path: &Path) -> Result<Backup, BackupFileError> {
    let bytes = fs::read(path).map_err(|source| BackupFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Backup::decode(&bytes).map_err(|source| BackupFileError::Backup {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Key;
    use crate::server::ImageGrant;

    /// A directory of this test's own, made anew.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ticketing-backup-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn backup() -> Backup {
        let grant = ImageGrant {
            key: Key::new("k").unwrap(),
            token: 5,
            remaining_ms: 100,
        };
        Backup::new(None, 3, 1, vec![grant])
    }

    #[test]
    fn a_backup_written_reads_back_and_replaces_the_file_whole() {
        let dir = scratch("replace");
        let path = dir.join("b.backup");
        fs::write(&path, b"an older file").unwrap();
        write_backup(&path, &backup()).unwrap();
        assert_eq!(read_backup(&path).unwrap(), backup());
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["b.backup"], "no temporary left");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "readable by its owner only: {mode:o}");
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cut_file_or_a_planted_temporary_is_an_error_not_a_backup() {
        let dir = scratch("cut");
        let path = dir.join("b.backup");
        let bytes = backup().encode();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(
            read_backup(&path),
            Err(BackupFileError::Backup { .. })
        ));
        // A link planted where the temporary goes is not written through.
        #[cfg(unix)]
        {
            let target = dir.join("target");
            fs::write(&target, b"keep").unwrap();
            let tmp = dir.join(format!(".b.backup.tmp-{}", std::process::id()));
            std::os::unix::fs::symlink(&target, &tmp).unwrap();
            assert!(matches!(
                write_backup(&path, &backup()),
                Err(BackupFileError::Io { .. })
            ));
            assert_eq!(fs::read(&target).unwrap(), b"keep");
        }
        assert!(matches!(
            read_backup(&dir.join("none")),
            Err(BackupFileError::Io { .. })
        ));
        let _ = fs::remove_dir_all(&dir);
    }
}
