//! Backup and restore (PROTOCOL.md 4.4, "Backup and restore"): the
//! committed table written out on request ([`Replica::backup`]), and a new
//! cluster that begins from it ([`ReplicaConfig::restore`]).
//!
//! **The file** is text with a checksum as its last line, as the table
//! images of 4.1 are, so that a torn or cut copy reads as an error, never
//! as a smaller table:
//!
//! ```text
//! ticketing-backup 1
//! cluster <32 hex digits>|-     the identity of the cluster it came from
//! index <N>                     the applied index the table is at
//! <a table image>               the floor as its epoch; every grant, its token and lease left
//! sum <16 hex digits>
//! ```
//!
//! **A restore** is made by the new cluster's first leader, in the entry
//! that commits its floor and identity: a marker ([`Decision::Restored`])
//! and every grant of the file with its own token, its lease counted from
//! when each member applies it. The floor is above every token of the file,
//! so every later token is too. The grants go through the leader's table
//! as its own decisions do, so an answer that depends on one waits for the
//! entry's commit. Every member is started with the same file; one whose
//! file the committed marker does not match stops ([`ReplicaEvent::
//! RestoreDiffers`]), and so does one given a file in a cluster whose first
//! leader restored none, so that a restore is never skipped in silence.
//!
//! [`ReplicaConfig::restore`]: super::ReplicaConfig::restore
//! [`ReplicaEvent:: RestoreDiffers`]: super::ReplicaEvent::RestoreDiffers

use core::fmt::Write as _;
use core::num::NonZeroU64;
use core::time::Duration;

use thiserror::Error;

use super::{ClusterId, Replica, ReplicaEvent};
use crate::server::image::{number, seal, unseal};
use crate::server::token::epoch_of;
use crate::server::{Decision, ImageError, ImageGrant, TableImage};

/// The first line of a backup.
const BACKUP_MAGIC: &str = "ticketing-backup 1";

/// A replicated cluster's committed table at one applied index.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backup {
    /// The cluster it came from, if its identity was committed.
    pub cluster: Option<ClusterId>,
    /// The applied index the table is at.
    pub index: u64,
    /// The cluster's floor for tokens ([`Decision::Floor`]).
    pub floor: u64,
    /// Every grant, in key order, with its lease left when it was taken.
    pub grants: Vec<ImageGrant>,
}

/// Why bytes are not a backup.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BackupError {
    /// Not whole, or not a backup this version reads.
    #[error("{0}")]
    Image(#[from] ImageError),
    /// A grant's token is of an epoch the cluster had not reached at the
    /// backup's index, or two grants are of one key: no cluster wrote it.
    #[error("the grant of {key} cannot be in a backup at index {index}")]
    Impossible {
        /// The key.
        key: String,
        /// The backup's index.
        index: u64,
    },
}

impl Backup {
    /// A backup of `grants` at `index` of `cluster`, whose floor is `floor`.
    pub fn new(
        cluster: Option<ClusterId>,
        index: u64,
        floor: u64,
        grants: Vec<ImageGrant>,
    ) -> Backup {
        Backup {
            cluster,
            index,
            floor,
            grants,
        }
    }

    /// The backup as bytes, checksum last.
    pub fn encode(&self) -> Vec<u8> {
        let image = TableImage {
            epoch: self.floor,
            count: 0,
            max_lease_ms: self
                .grants
                .iter()
                .map(|g| g.remaining_ms)
                .max()
                .unwrap_or(0),
            grace_ms: 0,
            written_at: Duration::ZERO,
            grants: self.grants.clone(),
        };
        let mut body = String::new();
        let _ = writeln!(body, "{BACKUP_MAGIC}");
        let cluster = self
            .cluster
            .map_or_else(|| "-".to_owned(), |c| c.to_string());
        let _ = writeln!(body, "cluster {cluster}");
        let _ = writeln!(body, "index {}", self.index);
        // The image is text too, sealed by its own checksum line.
        body.push_str(&String::from_utf8_lossy(&image.encode()));
        seal(body)
    }

    /// Reads a backup back: anything but a whole, intact backup that a
    /// cluster could have written is an error.
    pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
        let body = unseal(bytes)?;
        let mut lines = body.splitn(4, '\n');
        let mut line = |at: usize| lines.next().ok_or(ImageError::Malformed { line: at });
        let bad = |at: usize| ImageError::Malformed { line: at };
        if line(1)? != BACKUP_MAGIC {
            return Err(bad(1).into());
        }
        let cluster = match line(2)?.strip_prefix("cluster ") {
            Some("-") => None,
            Some(hex) => Some(hex.parse::<ClusterId>().map_err(|_| bad(2))?),
            None => return Err(bad(2).into()),
        };
        let index = line(3)?
            .strip_prefix("index ")
            .and_then(number)
            .ok_or(bad(3))?;
        let image = TableImage::decode(line(4)?.as_bytes())?;
        let mut previous: Option<&str> = None;
        for g in &image.grants {
            let ahead = epoch_of(g.token) > image.epoch.saturating_add(index);
            if ahead || previous.is_some_and(|p| p >= g.key.as_str()) {
                return Err(BackupError::Impossible {
                    key: g.key.as_str().to_owned(),
                    index,
                });
            }
            previous = Some(g.key.as_str());
        }
        Ok(Backup {
            cluster,
            index,
            floor: image.epoch,
            grants: image.grants,
        })
    }

    /// The greatest token of the file, 0 for none.
    pub fn max_token(&self) -> u64 {
        self.grants.iter().map(|g| g.token).max().unwrap_or(0)
    }

    /// The least floor of a cluster restored from it: every token of the
    /// cluster it came from up to its index, so every token of the file,
    /// is below the first token of the floor's first entry.
    fn floor_above(&self) -> u64 {
        self.floor
            .saturating_add(self.index)
            .max(epoch_of(self.max_token()))
            .saturating_add(1)
    }

    /// The marker a restore commits, for every member to check.
    fn marker(&self) -> Decision {
        Decision::Restored {
            index: self.index,
            grants: self.grants.len() as u64,
        }
    }
}

impl Replica {
    /// This member's committed table, at its applied index: what
    /// `ticketing cluster snapshot` writes (the leader's, whose table is
    /// the latest).
    pub fn backup(&self) -> Backup {
        let image = self.copy.image(self.now, Duration::ZERO);
        Backup {
            cluster: self.cluster,
            index: self.applied,
            floor: self.floor,
            grants: image
                .grants
                .into_iter()
                .filter(|g| g.remaining_ms > 0)
                .collect(),
        }
    }

    /// The floor of a cluster's first leader: above every token of the
    /// backup it restores, if it restores one.
    pub(super) fn first_floor(&self, wall: u64) -> u64 {
        self.restore
            .as_ref()
            .map_or(wall, |b| wall.max(b.floor_above()))
    }

    /// A first leader that restores: every grant of the file into its
    /// table as its own decisions (proposed with the floor, each lease
    /// capped as the server caps them), and the marker before them.
    pub(super) fn seed_restore(&mut self) {
        let Some(backup) = &self.restore else {
            return;
        };
        let max_lease = self.server.config().max_lease;
        let grants: Vec<Decision> = backup
            .grants
            .iter()
            .map(|g| Decision::Grant {
                key: g.key.clone(),
                token: g.token,
                // At least a millisecond: a lease of none is no grant.
                lease_ms: NonZeroU64::new(
                    g.remaining_ms.min(crate::time::duration_millis(max_lease)),
                )
                .unwrap_or(NonZeroU64::MIN),
            })
            .collect();
        self.restore_to_propose = Some(backup.marker());
        self.server.restore_replicated(self.now, grants);
    }

    /// The marker of a committed restore: this member's own file, if it
    /// was given one, must be the one restored.
    pub(super) fn check_restored(&mut self, index: u64, grants: u64) {
        if let Some(ours) = self.restore.take() {
            if (ours.index, ours.grants.len() as u64) != (index, grants) {
                self.stop(ReplicaEvent::RestoreDiffers {
                    index: ours.index,
                    grants: ours.grants.len() as u64,
                    committed: Some((index, grants)),
                });
            }
        }
    }

    /// A floor committed while this member still holds its backup: no
    /// marker came before it, so the cluster restored none, and this
    /// member stops.
    pub(super) fn check_first_floor(&mut self) {
        if let Some(ours) = self.restore.take() {
            self.stop(ReplicaEvent::RestoreDiffers {
                index: ours.index,
                grants: ours.grants.len() as u64,
                committed: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::tests::{admin_lines, elected, Cluster};
    use super::*;
    use crate::names::Key;
    use crate::server::raft::Restored;
    use crate::server::{Config, Server};
    use crate::time::Time;

    fn backup() -> Backup {
        Backup::new(
            ClusterId::new(0xabc),
            1_234,
            1_700_000_000_000,
            vec![
                ImageGrant {
                    key: Key::new("a").unwrap(),
                    token: (1_700_000_000_900 << 22) + 3,
                    remaining_ms: 5_000,
                },
                ImageGrant {
                    key: Key::new("b/c").unwrap(),
                    token: (1_700_000_001_000 << 22) + 1,
                    remaining_ms: 1,
                },
            ],
        )
    }

    #[test]
    fn a_backup_reads_back_as_written_and_nothing_cut_or_changed_does() {
        let b = backup();
        let bytes = b.encode();
        assert_eq!(Backup::decode(&bytes), Ok(b.clone()));
        let none = Backup::new(None, 0, 1, Vec::new());
        assert_eq!(Backup::decode(&none.encode()), Ok(none));
        for end in 0..bytes.len() {
            assert!(Backup::decode(&bytes[..end]).is_err(), "cut at {end}");
        }
        for at in 0..bytes.len() {
            let mut changed = bytes.clone();
            changed[at] ^= 0x01;
            assert!(Backup::decode(&changed).is_err(), "byte {at} changed");
        }
    }

    #[test]
    fn a_backup_no_cluster_could_have_written_is_refused() {
        let mut ahead = backup();
        // A token of an epoch past the floor plus the index.
        ahead.grants[1].token = (1_700_000_001_235 << 22) + 1;
        assert!(matches!(
            Backup::decode(&ahead.encode()),
            Err(BackupError::Impossible { ref key, index: 1_234 }) if key == "b/c"
        ));
        let mut twice = backup();
        twice.grants[1].key = Key::new("a").unwrap();
        assert!(matches!(
            Backup::decode(&twice.encode()),
            Err(BackupError::Impossible { .. })
        ));
    }

    #[test]
    fn the_floor_of_a_restore_is_above_every_token_of_the_file() {
        let b = backup();
        let floor = b.floor_above();
        assert!(floor > epoch_of(b.max_token()));
        assert_eq!(floor, 1_700_000_000_000 + 1_234 + 1);
        // A file whose tokens are beyond its floor and index still gives a
        // floor above them (no cluster writes one; a hand-made one may).
        let odd = Backup::new(None, 0, 5, vec![b.grants[0].clone()]);
        assert!(odd.floor_above() > epoch_of(odd.max_token()));
        let end = Backup::new(None, u64::MAX, u64::MAX, Vec::new());
        assert_eq!(end.floor_above(), u64::MAX, "saturates, never wraps");
    }

    /// A cluster whose leader granted `k0`..`k4`, and the backup of its
    /// committed table, as the leader answers it on an administrative
    /// connection and as [`Replica::backup`] gives it.
    fn backed_up() -> Backup {
        let (mut c, leader) = elected();
        let conn = c.connect(leader, "H 2 c -\n");
        for i in 0..5 {
            c.request(leader, conn, &format!("A {i} k{i} o 0 60000\n"));
        }
        c.run(Duration::from_millis(50));
        let backup = c.replicas[&leader].backup();
        assert_eq!(backup.grants.len(), 5);
        for (i, g) in backup.grants.iter().enumerate() {
            assert_eq!(g.key.as_str(), format!("k{i}"));
            assert_eq!(g.token, c.token(leader, conn, &format!("k{i}")));
            assert!(g.remaining_ms > 59_000 && g.remaining_ms <= 60_000);
        }
        assert_eq!(backup.cluster, c.replicas[&leader].cluster());
        assert_eq!(backup.index, c.replicas[&leader].applied());
        let admin = c.connect(leader, "HA 1 -\n");
        c.request(leader, admin, "Q 7 snapshot\n");
        c.run(Duration::from_millis(10));
        let lines = admin_lines(&c, leader, admin);
        let cluster = backup.cluster.expect("an identity");
        assert_eq!(
            lines[1],
            format!("SB 7 {cluster} {} {} 5", backup.index, backup.floor)
        );
        for (line, g) in lines[2..].iter().zip(&backup.grants) {
            // Taken 10 ms later: as much lease left, or less.
            let head = format!("SG 7 {} {} ", g.key.as_str(), g.token);
            let left: u64 = line.strip_prefix(&head).expect(line).parse().unwrap();
            assert!(
                left <= g.remaining_ms && left + 20 >= g.remaining_ms,
                "{line}"
            );
        }
        assert_eq!(lines.len(), 7, "{lines:?}");
        // A follower names the leader.
        let follower = (1..=3).find(|&id| id != leader).unwrap();
        let admin = c.connect(follower, "HA 1 -\n");
        c.request(follower, admin, "Q 8 snapshot\n");
        c.run(Duration::from_millis(10));
        assert_eq!(
            admin_lines(&c, follower, admin)[1],
            format!("NO 8 not_leader 10.0.0.{leader}:7878")
        );
        Backup::decode(&backup.encode()).expect("reads back")
    }

    fn every_member(backup: &Backup) -> BTreeMap<u64, Backup> {
        (1..=3).map(|id| (id, backup.clone())).collect()
    }

    #[test]
    fn a_cluster_restored_holds_every_grant_with_its_token_and_grants_above_them() {
        let backup = backed_up();
        let mut c = Cluster::restoring(10_000, false, every_member(&backup));
        c.run(Duration::from_secs(1));
        let leader = c.leader().expect("a leader");
        for id in 1..=3 {
            for g in &backup.grants {
                let held = c.replicas[&id].copy().holder(g.key.as_str());
                assert_eq!(held.map(|h| h.token), Some(g.token), "{} at {id}", g.key);
            }
        }
        assert!(c
            .events
            .iter()
            .all(|(_, e)| !matches!(e, ReplicaEvent::RestoreDiffers { .. })));
        let conn = c.connect(leader, "H 2 c -\n");
        let [k0, k1, ..] = &backup.grants[..] else {
            panic!("two grants")
        };
        // The holder of k0 renews by its token; k1 is held; k1 released by
        // its token is granted again above it, and so is a key never held.
        c.request(leader, conn, &format!("X 1 k0 {} 8000\n", k0.token));
        c.request(leader, conn, "A 2 k1 o 0 1000\n");
        c.request(leader, conn, &format!("R 3 k1 {}\n", k1.token));
        c.request(leader, conn, "A 4 k1 o 0 1000\n");
        c.request(leader, conn, "A 5 fresh o 0 1000\n");
        c.run(Duration::from_millis(50));
        let text = c.text(leader, conn).to_string();
        assert!(
            text.contains(&format!("G 1 X k0 {} 8000", k0.token)),
            "{text}"
        );
        assert!(text.contains("T 2 A k1"), "{text}");
        assert!(text.contains("D 3 R k1"), "{text}");
        let max = backup.max_token();
        assert!(c.token(leader, conn, "k1") > max, "{text}");
        assert!(c.token(leader, conn, "fresh") > max, "{text}");
        assert!(c.replicas[&leader].floor() > backup.floor + backup.index);
        // The new cluster draws an identity of its own (the same bits here:
        // this harness draws by member id).
        assert!(c.replicas[&leader].cluster().is_some());
    }

    #[test]
    fn a_lease_restored_counts_from_the_restore_not_from_the_backup() {
        let mut backup = backed_up();
        backup.grants.truncate(1);
        backup.grants[0].remaining_ms = 400;
        let mut c = Cluster::restoring(10_000, false, every_member(&backup));
        // However long after the backup the restore comes.
        c.now = c.now.saturating_add(Duration::from_secs(3_600));
        c.run(Duration::from_millis(300));
        let leader = c.leader().expect("a leader");
        let key = backup.grants[0].key.as_str();
        assert!(c.replicas[&leader].copy().holder(key).is_some());
        c.run(Duration::from_millis(400));
        assert!(c.replicas[&leader].copy().holder(key).is_none(), "ran out");
    }

    #[test]
    fn a_member_given_another_backup_or_none_restored_stops_and_says_so() {
        let backup = backed_up();
        let mut other = backup.clone();
        other.grants.pop();
        // Member 1 stands first: it restores its own.
        let mut restores = every_member(&backup);
        restores.insert(3, other);
        let mut c = Cluster::restoring(10_000, false, restores);
        c.run(Duration::from_secs(1));
        assert_eq!(c.leader(), Some(1));
        let said = |c: &Cluster, id: u64| {
            c.events.iter().find_map(|(at, e)| match e {
                ReplicaEvent::RestoreDiffers { committed, .. } if *at == id => Some(*committed),
                _ => None,
            })
        };
        assert_eq!(said(&c, 3), Some(Some((backup.index, 5))));
        assert_eq!((said(&c, 1), said(&c, 2)), (None, None));
        assert!(!c.replicas[&3].is_serving());
        // A first leader given none restores none; a member given one stops.
        let restores = BTreeMap::from([(2, backup.clone())]);
        let mut c = Cluster::restoring(10_000, false, restores);
        c.run(Duration::from_secs(1));
        assert_eq!(c.leader(), Some(1));
        assert_eq!(said(&c, 2), Some(None));
        assert!(c.replicas[&1].copy().holder("k0").is_none());
    }

    #[test]
    fn a_backup_is_restored_only_into_a_new_cluster() {
        let backup = backed_up();
        let members: BTreeMap<u64, crate::names::Endpoint> = (1..=3)
            .map(|id| {
                (
                    id,
                    crate::names::Endpoint::new(format!("10.0.0.{id}:1")).unwrap(),
                )
            })
            .collect();
        let mut used = Restored::new_cluster(1..=3);
        used.hard_state.commit = 3;
        for restored in [used, Restored::default()] {
            let server = Server::new(
                Config::new(crate::names::Name::new("n").unwrap()),
                Time::ZERO,
            )
            .unwrap();
            let mut config = crate::server::raft::ReplicaConfig::new(
                1,
                members.clone(),
                Duration::from_secs(1),
                1,
            );
            config.restore = Some(backup.clone());
            assert!(matches!(
                Replica::new(config, server, restored, Time::ZERO),
                Err(crate::server::raft::ReplicaError::RestoreIntoExisting)
            ));
        }
    }

    /// Writes the seeds of the `backup` fuzz target's corpus (and one
    /// entry with a restore's marker for `decisions`) into
    /// `TICKETING_SEED_DIR`: `cargo test --features raft --lib
    /// backup::tests::seeds -- --ignored`.
    #[test]
    #[ignore = "writes fuzz seeds"]
    fn seeds() {
        let dir = std::path::PathBuf::from(std::env::var("TICKETING_SEED_DIR").expect("a dir"));
        let most = ImageGrant {
            key: Key::new("z").unwrap(),
            token: u64::MAX,
            remaining_ms: u64::MAX,
        };
        let seeds = [
            backup(),
            Backup::new(None, 0, 1, Vec::new()),
            Backup::new(ClusterId::new(u128::MAX), u64::MAX, u64::MAX, vec![most]),
        ];
        for (i, b) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("backup-{i}")), b.encode()).unwrap();
        }
        let marker = Decision::encode_entry(&[backup().marker()]);
        std::fs::write(dir.join("decisions-restored"), marker).unwrap();
    }
}
