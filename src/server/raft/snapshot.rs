//! What a member's snapshot holds (its `data`): the committed table, as a
//! [`TableImage`], and what the log held beside it that compaction would
//! otherwise drop — the cluster's identity.
//!
//! `TKSN`, a format byte (1), the identity's 16 bytes little-endian (all
//! zero: none was committed yet), then the image's own bytes, which carry
//! their checksum. A snapshot taken before identities existed is the
//! image alone; it reads back with no identity.

use super::ClusterId;
use crate::server::TableImage;

const MAGIC: &[u8; 4] = b"TKSN";
const FORMAT: u8 = 1;
const HEADER: usize = MAGIC.len() + 1 + 16;

/// A member's snapshot of its committed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SnapshotData {
    pub(super) cluster: Option<ClusterId>,
    pub(super) image: TableImage,
}

impl SnapshotData {
    pub(super) fn encode(&self) -> Vec<u8> {
        let image = self.image.encode();
        let mut out = Vec::with_capacity(HEADER + image.len());
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        out.extend_from_slice(&ClusterId::bits_of(self.cluster).to_le_bytes());
        out.extend_from_slice(&image);
        out
    }

    /// The snapshot `data` holds, or `None` if it is not one.
    pub(super) fn decode(data: &[u8]) -> Option<SnapshotData> {
        let (cluster, image) = match data.strip_prefix(MAGIC) {
            Some([FORMAT, rest @ ..]) => {
                let (bits, image) = rest.split_first_chunk::<16>()?;
                (ClusterId::new(u128::from_le_bytes(*bits)), image)
            }
            Some(_) => return None,
            // Written before snapshots carried an identity.
            None => (None, data),
        };
        let image = TableImage::decode(image).ok()?;
        Some(SnapshotData { cluster, image })
    }
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
                image: image(),
            };
            assert_eq!(SnapshotData::decode(&data.encode()), Some(data));
        }
        let older = SnapshotData::decode(&image().encode()).expect("an image alone");
        assert_eq!((older.cluster, older.image), (None, image()));
    }

    #[test]
    fn a_cut_or_changed_snapshot_is_not_one() {
        let bytes = SnapshotData {
            cluster: ClusterId::new(7),
            image: image(),
        }
        .encode();
        for end in 0..bytes.len() {
            assert_eq!(SnapshotData::decode(&bytes[..end]), None, "cut at {end}");
        }
        let mut other_format = bytes.clone();
        other_format[4] = 2;
        assert_eq!(SnapshotData::decode(&other_format), None);
        let mut flipped = bytes;
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(SnapshotData::decode(&flipped), None);
    }
}
