//! What a member's snapshot holds (its `data`): the committed table, as a
//! [`TableImage`], and what the log held beside it that compaction would
//! otherwise drop — the cluster's identity, and every member's addresses
//! (the configuration's changes carried them; the snapshot's metadata
//! holds only the ids).
//!
//! `TKSN`, a format byte (2), the identity's 16 bytes little-endian (all
//! zero: none was committed yet), the members' addresses (a 2-byte
//! little-endian length, then that many bytes of text: one line
//! `id client peer|-` per member, each ending in `\n`), then the image's
//! own bytes, which carry their checksum. Format 1 had no addresses; a
//! snapshot taken before identities existed is the image alone. Both read
//! back, with nothing for what they lack.

use std::collections::BTreeMap;

use super::membership::{MemberAddrs, Roster};
use super::ClusterId;
use crate::server::TableImage;

const MAGIC: &[u8; 4] = b"TKSN";
const FORMAT: u8 = 2;
/// Format 1: the identity, no addresses.
const FORMAT_1: u8 = 1;
const HEADER: usize = MAGIC.len() + 1 + 16;

/// A member's snapshot of its committed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SnapshotData {
    pub(super) cluster: Option<ClusterId>,
    pub(super) roster: Roster,
    pub(super) image: TableImage,
}

impl SnapshotData {
    pub(super) fn encode(&self) -> Vec<u8> {
        let image = self.image.encode();
        // Whole lines, as many as the length can say: some 120 members at
        // the least, far more than a Raft cluster has.
        let mut roster = String::new();
        for (id, addrs) in self.roster.iter() {
            let line = addrs.encode(id) + "\n";
            if roster.len() + line.len() > usize::from(u16::MAX) {
                break;
            }
            roster.push_str(&line);
        }
        let roster = roster.as_bytes();
        let mut out = Vec::with_capacity(HEADER + 2 + roster.len() + image.len());
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        out.extend_from_slice(&ClusterId::bits_of(self.cluster).to_le_bytes());
        out.extend_from_slice(&(roster.len() as u16).to_le_bytes());
        out.extend_from_slice(roster);
        out.extend_from_slice(&image);
        out
    }

    /// The snapshot `data` holds, or `None` if it is not one.
    pub(super) fn decode(data: &[u8]) -> Option<SnapshotData> {
        let (cluster, roster, image) = match data.strip_prefix(MAGIC) {
            Some([format @ (FORMAT | FORMAT_1), rest @ ..]) => {
                let (bits, rest) = rest.split_first_chunk::<16>()?;
                let cluster = ClusterId::new(u128::from_le_bytes(*bits));
                if *format == FORMAT_1 {
                    (cluster, Roster::default(), rest)
                } else {
                    let (len, rest) = rest.split_first_chunk::<2>()?;
                    let len = usize::from(u16::from_le_bytes(*len));
                    let (roster, image) = (rest.get(..len)?, rest.get(len..)?);
                    (cluster, roster_of(roster)?, image)
                }
            }
            Some(_) => return None,
            // Written before snapshots carried an identity.
            None => (None, Roster::default(), data),
        };
        let image = TableImage::decode(image).ok()?;
        Some(SnapshotData {
            cluster,
            roster,
            image,
        })
    }
}

/// The addresses' lines, or `None` if one is not one.
fn roster_of(bytes: &[u8]) -> Option<Roster> {
    let text = core::str::from_utf8(bytes).ok()?;
    let mut members = BTreeMap::new();
    for line in text.split_terminator('\n') {
        let (id, addrs): (u64, MemberAddrs) = MemberAddrs::decode(line)?;
        members.insert(id, addrs);
    }
    Some(Roster::from_members(members))
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use super::*;
    use crate::names::Key;
    use crate::server::ImageGrant;

    fn image() -> TableImage {
        TableImage {
            epoch: 1_700_000_000_000,
            count: 0,
            max_lease_ms: 30_000,
            grace_ms: 0,
            written_at: Duration::ZERO,
            grants: vec![ImageGrant {
                key: Key::new("k").unwrap(),
                token: 99,
                remaining_ms: 1_000,
            }],
        }
    }

    #[test]
    fn a_snapshot_reads_back_with_its_identity_and_an_older_one_without() {
        for cluster in [None, ClusterId::new(7), ClusterId::new(u128::MAX)] {
            let data = SnapshotData {
                cluster,
                roster: roster(),
                image: image(),
            };
            assert_eq!(SnapshotData::decode(&data.encode()), Some(data));
        }
        let older = SnapshotData::decode(&image().encode()).expect("an image alone");
        assert_eq!(
            (older.cluster, older.roster, older.image),
            (None, Roster::default(), image())
        );
        // Format 1: the identity, no addresses.
        let mut format_1 = b"TKSN\x01".to_vec();
        format_1.extend_from_slice(&7u128.to_le_bytes());
        format_1.extend_from_slice(&image().encode());
        let read = SnapshotData::decode(&format_1).expect("format 1");
        assert_eq!(
            (read.cluster, read.roster, read.image),
            (ClusterId::new(7), Roster::default(), image())
        );
    }

    fn roster() -> Roster {
        let addr = |s: &str| crate::names::Endpoint::new(s).unwrap();
        Roster::from_members(BTreeMap::from([
            (
                1,
                MemberAddrs::new(addr("10.0.0.1:7878"), Some(addr("10.0.0.1:7979"))),
            ),
            (4, MemberAddrs::new(addr("db-4.example:7878"), None)),
        ]))
    }

    #[test]
    fn a_cut_or_changed_snapshot_is_not_one() {
        let bytes = SnapshotData {
            cluster: ClusterId::new(7),
            roster: roster(),
            image: image(),
        }
        .encode();
        for end in 0..bytes.len() {
            assert_eq!(SnapshotData::decode(&bytes[..end]), None, "cut at {end}");
        }
        let mut other_format = bytes.clone();
        other_format[4] = 3;
        assert_eq!(SnapshotData::decode(&other_format), None);
        let mut flipped = bytes;
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(SnapshotData::decode(&flipped), None);
    }
}
