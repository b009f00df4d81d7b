//! The records of a member's Raft state (module `disk`, "On disk"),
//! sans-IO: a segment's header (its identity, its witness slots), a
//! record's framing and checksum, a `Ready`'s payload, a seal. What the
//! files hold, in what order, and what a start makes of them, is
//! `disk`'s.

use std::io::{self, Read};

use raft::eraftpb::{Entry, HardState, Snapshot};

use crate::host::state;

/// The longest payload a record may have: a snapshot of the largest table
/// a state directory keeps ([`state::MAX_TABLE_LEN`]), with 1 MiB for the
/// rest. Longer records are neither written nor read (no read allocates
/// more).
pub const MAX_RECORD_LEN: u64 = state::MAX_TABLE_LEN + (1 << 20);

/// What a segment with a header begins with. Its first four bytes, read
/// as a record's length, are more than [`MAX_RECORD_LEN`]: a segment from
/// before headers, which begins with a record, never begins with it.
pub const SEGMENT_MAGIC: [u8; 8] = *b"\x89TKRAFT\n";

const _: () = assert!(
    u32::from_le_bytes([
        SEGMENT_MAGIC[0],
        SEGMENT_MAGIC[1],
        SEGMENT_MAGIC[2],
        SEGMENT_MAGIC[3]
    ]) as u64
        > MAX_RECORD_LEN
);

/// The segments' format this build writes and reads.
pub(super) const FORMAT_VERSION: u32 = 1;

/// One part of a segment's header to a page, so that writing one part
/// never writes another's page.
pub(super) const PAGE: u64 = 4096;

/// A segment's header: its identity, then two witness slots; its records
/// begin here.
pub const SEGMENT_HEADER_LEN: u64 = 3 * PAGE;

/// Where the witness slots are.
pub(super) const SLOT_AT: [u64; 2] = [PAGE, 2 * PAGE];

/// The bytes of a segment's identity and of a witness slot.
pub(super) const IDENTITY_LEN: usize = 36;
pub(super) const SLOT_LEN: usize = 64;

/// A segment's flag: it holds the whole log (written by an upgrade from
/// before headers), so the segments numbered below it are its leftovers.
pub(super) const FLAG_WHOLE: u32 = 1;

/// A record's header: length, checksum, kind.
pub(super) const RECORD_HEADER_LEN: u64 = 9;

/// The kinds of records.
pub(super) const KIND_CONF: u8 = 1;
pub(super) const KIND_READY: u8 = 2;
pub(super) const KIND_SNAPSHOT: u8 = 3;
pub(super) const KIND_SEAL: u8 = 4;

/// A seal's payload: three `u64`s.
pub(super) const SEAL_LEN: usize = 24;

/// A segment's identity, the first part of its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) flags: u32,
    pub(super) member: u64,
    pub(super) n: u64,
}

impl Identity {
    pub(super) fn encode(&self) -> [u8; IDENTITY_LEN] {
        let mut bytes = [0; IDENTITY_LEN];
        bytes[..8].copy_from_slice(&SEGMENT_MAGIC);
        bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.flags.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.member.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.n.to_le_bytes());
        let crc = crc32(&[&bytes[..32]]);
        bytes[32..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    pub(super) fn decode(bytes: &[u8; IDENTITY_LEN]) -> Result<Identity, String> {
        if bytes[..8] != SEGMENT_MAGIC {
            return Err("it does not begin with a segment's magic".to_string());
        }
        if crc32(&[&bytes[..32]]) != u32_at(bytes, 32) {
            return Err("its checksum does not match".to_string());
        }
        let version = u32_at(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "format {version}, which this build does not read (it reads {FORMAT_VERSION})"
            ));
        }
        let flags = u32_at(bytes, 12);
        if flags & !FLAG_WHOLE != 0 {
            return Err(format!("flags this build does not know ({flags:#x})"));
        }
        Ok(Identity {
            flags,
            member: u64_at(bytes, 16),
            n: u64_at(bytes, 24),
        })
    }
}

/// What a witness slot says was synced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Witness {
    /// Greater in every slot written after.
    pub(super) seq: u64,
    /// The segment's bytes synced, from its start.
    pub(super) len: u64,
    /// The log's last index then.
    pub(super) last: u64,
    /// The hard state's commit then.
    pub(super) commit: u64,
    /// The cluster's identity (0: not known yet).
    pub(super) cluster: u128,
    /// No record follows but the seal, which ends at `len`.
    pub(super) sealed: bool,
}

impl Witness {
    pub(super) fn encode(&self) -> [u8; SLOT_LEN] {
        let mut bytes = [0; SLOT_LEN];
        bytes[..8].copy_from_slice(&self.seq.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.len.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.last.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.commit.to_le_bytes());
        bytes[32..48].copy_from_slice(&self.cluster.to_le_bytes());
        bytes[48] = u8::from(self.sealed);
        let crc = crc32(&[&bytes[..60]]);
        bytes[60..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for a slot never written (zeros), torn, or damaged.
    pub(super) fn decode(bytes: &[u8; SLOT_LEN]) -> Option<Witness> {
        if crc32(&[&bytes[..60]]) != u32_at(bytes, 60) {
            return None;
        }
        let sealed = match bytes[48] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let witness = Witness {
            seq: u64_at(bytes, 0),
            len: u64_at(bytes, 8),
            last: u64_at(bytes, 16),
            commit: u64_at(bytes, 24),
            cluster: u128::from_le_bytes(bytes[32..48].try_into().expect("16 bytes")),
            sealed,
        };
        (witness.len >= SEGMENT_HEADER_LEN && bytes[49..60].iter().all(|&b| b == 0))
            .then_some(witness)
    }
}

/// A seal's payload: what it closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seal {
    /// The bytes of the segment before the seal.
    pub(super) closes: u64,
    /// The log's last index then.
    pub(super) last: u64,
    /// The segment that follows.
    pub(super) next: u64,
}

impl Seal {
    pub(super) fn encode(&self) -> [u8; SEAL_LEN] {
        let mut bytes = [0; SEAL_LEN];
        bytes[..8].copy_from_slice(&self.closes.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.last.to_le_bytes());
        bytes[16..].copy_from_slice(&self.next.to_le_bytes());
        bytes
    }

    pub(super) fn decode(payload: &[u8]) -> Result<Seal, String> {
        let bytes: &[u8; SEAL_LEN] = payload
            .try_into()
            .map_err(|_| format!("a seal of {} bytes, not {SEAL_LEN}", payload.len()))?;
        Ok(Seal {
            closes: u64_at(bytes, 0),
            last: u64_at(bytes, 8),
            next: u64_at(bytes, 16),
        })
    }
}

/// A new segment, whole: its identity, a first witness (sequence 1, in
/// the first slot; the second left zeros, which no slot reads as), then
/// `records`, the last index and commit after them being `last` and
/// `commit`.
pub(super) fn segment_image(
    identity: Identity,
    records: &[u8],
    last: u64,
    commit: u64,
    cluster: u128,
) -> (Vec<u8>, Witness) {
    let len = SEGMENT_HEADER_LEN + records.len() as u64;
    let witness = Witness {
        seq: 1,
        len,
        last,
        commit,
        cluster,
        sealed: false,
    };
    let mut image = vec![0; SEGMENT_HEADER_LEN as usize];
    image[..IDENTITY_LEN].copy_from_slice(&identity.encode());
    let slot = SLOT_AT[0] as usize;
    image[slot..slot + SLOT_LEN].copy_from_slice(&witness.encode());
    image.extend_from_slice(records);
    (image, witness)
}

/// A `Ready` record's payload, as read back.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct ReadyRecord {
    #[prost(message, optional, tag = "1")]
    pub(super) hard_state: Option<HardState>,
    #[prost(message, repeated, tag = "2")]
    pub(super) entries: Vec<Entry>,
    #[prost(message, optional, tag = "3")]
    pub(super) snapshot: Option<Snapshot>,
}

/// A `Ready` record for `path`, encoded field by field (as
/// [`ReadyRecord`] reads it) so that nothing is copied first.
pub(super) fn ready_record(
    hard_state: Option<&HardState>,
    entries: &[Entry],
    snapshot: Option<&Snapshot>,
) -> Result<Vec<u8>, TooLarge> {
    use prost::encoding::message;
    let len = hard_state.map_or(0, |h| message::encoded_len(1, h))
        + entries
            .iter()
            .map(|e| message::encoded_len(2, e))
            .sum::<usize>()
        + snapshot.map_or(0, |s| message::encoded_len(3, s));
    frame(KIND_READY, len, |buf| {
        if let Some(hard_state) = hard_state {
            message::encode(1, hard_state, buf);
        }
        for entry in entries {
            message::encode(2, entry, buf);
        }
        if let Some(snapshot) = snapshot {
            message::encode(3, snapshot, buf);
        }
    })
}

/// A record longer than [`MAX_RECORD_LEN`]: the payload's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooLarge(pub(super) u64);

/// A record: the header, then the `len` bytes `payload` writes.
pub(super) fn frame(
    kind: u8,
    len: usize,
    payload: impl FnOnce(&mut Vec<u8>),
) -> Result<Vec<u8>, TooLarge> {
    let too_large = TooLarge(len as u64);
    if too_large.0 > MAX_RECORD_LEN {
        return Err(too_large);
    }
    let len32 = u32::try_from(len).map_err(|_| too_large)?;
    let mut buf = Vec::with_capacity(RECORD_HEADER_LEN as usize + len);
    buf.extend_from_slice(&len32.to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.push(kind);
    payload(&mut buf);
    debug_assert_eq!(buf.len(), RECORD_HEADER_LEN as usize + len);
    let crc = crc32(&[&buf[..4], &buf[8..]]);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

/// Why a record cannot be read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bad {
    /// It goes past the end of the file.
    CutShort,
    /// Its checksum does not match; `to_end` if it ends the file.
    Checksum { to_end: bool },
    /// Its length is more than a record may have.
    TooLong,
}

impl Bad {
    pub(super) fn why(self) -> &'static str {
        match self {
            Bad::CutShort => "a record cut short",
            Bad::Checksum { .. } => "a record whose checksum does not match",
            Bad::TooLong => "a record longer than a record may be",
        }
    }
}

/// What a record read from a file turned out to be.
pub(super) enum Read1 {
    Record { kind: u8, payload: Vec<u8> },
    Bad(Bad),
}

/// The next record, with `rest` bytes left in the file.
pub(super) fn read_one(reader: &mut impl Read, rest: u64) -> io::Result<Read1> {
    if rest < RECORD_HEADER_LEN {
        return Ok(Read1::Bad(Bad::CutShort));
    }
    let mut header = [0; RECORD_HEADER_LEN as usize];
    reader.read_exact(&mut header)?;
    let len = u64::from(u32_at(&header, 0));
    let crc = u32_at(&header, 4);
    let kind = header[8];
    if RECORD_HEADER_LEN + len > rest {
        return Ok(Read1::Bad(Bad::CutShort));
    }
    let to_end = RECORD_HEADER_LEN + len == rest;
    if len > MAX_RECORD_LEN {
        return Ok(Read1::Bad(Bad::TooLong));
    }
    let mut payload = vec![0; len as usize];
    reader.read_exact(&mut payload)?;
    if crc32(&[&header[..4], &header[8..], &payload]) != crc {
        return Ok(Read1::Bad(Bad::Checksum { to_end }));
    }
    Ok(Read1::Record { kind, payload })
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's) of the parts, one after the
/// other.
pub(super) fn crc32(parts: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        let empty: &[u8] = b"";
        assert_eq!(crc32(&[b"1234", empty, b"56789"]), 0xCBF4_3926);
    }

    #[test]
    fn the_magic_is_never_how_a_segment_from_before_headers_begins() {
        let first = u32::from_le_bytes(SEGMENT_MAGIC[..4].try_into().unwrap());
        assert!(u64::from(first) > MAX_RECORD_LEN);
        let bare = frame(KIND_CONF, 0, |_| {}).unwrap();
        assert!(u64::from(u32_at(&bare, 0)) <= MAX_RECORD_LEN);
    }

    #[test]
    fn a_record_reads_back_and_a_cut_or_changed_one_does_not() {
        let record = frame(KIND_READY, 5, |buf| buf.extend_from_slice(b"hello")).unwrap();
        let read = |bytes: &[u8]| read_one(&mut &bytes[..], bytes.len() as u64).unwrap();
        assert!(matches!(
            read(&record),
            Read1::Record { kind: KIND_READY, payload } if payload == b"hello"
        ));
        for cut in 0..record.len() {
            assert!(
                matches!(read(&record[..cut]), Read1::Bad(Bad::CutShort)),
                "{cut}"
            );
        }
        let mut changed = record.clone();
        changed[10] ^= 1;
        assert!(matches!(
            read(&changed),
            Read1::Bad(Bad::Checksum { to_end: true })
        ));
        assert_eq!(
            frame(KIND_READY, MAX_RECORD_LEN as usize + 1, |_| {}),
            Err(TooLarge(MAX_RECORD_LEN + 1))
        );
    }
}
