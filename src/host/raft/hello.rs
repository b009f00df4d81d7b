//! The peer hello (module `peers`, "The hello"), and the answer to a peer
//! that is not a member, sans-IO: their bytes, and nothing else. Whether a hello is admitted is the links' to decide.

/// The first bytes of every hello.
const MAGIC: [u8; 4] = *b"TKRP";
/// The version of the peer link this module speaks, and the only one.
const VERSION: u16 = 2;
/// The longest hello: magic, version, two ids, the cluster's identity,
/// the credential's length and the longest credential (290 bytes), with
/// room to spare.
pub(super) const HELLO_MAX: usize = 512;

/// A hello: who sends, to whom, for which cluster (0: not known yet),
/// with what credential. The answer to one is a hello from the other side,
/// without a credential.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Hello<'a> {
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) cluster: u128,
    pub(super) credential: &'a [u8],
}

impl Hello<'_> {
    /// The hello as a frame, its length first.
    pub(super) fn frame(&self) -> Vec<u8> {
        let body = 4 + 2 + 8 + 8 + 16 + 2 + self.credential.len();
        let mut out = Vec::with_capacity(4 + body);
        // A credential is at most MAX_ATOM bytes: both fit.
        out.extend_from_slice(&(body as u32).to_be_bytes());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&self.from.to_be_bytes());
        out.extend_from_slice(&self.to.to_be_bytes());
        out.extend_from_slice(&self.cluster.to_be_bytes());
        out.extend_from_slice(&(self.credential.len() as u16).to_be_bytes());
        out.extend_from_slice(self.credential);
        out
    }

    /// A hello's body, if it is one of this version.
    pub(super) fn parse(body: &[u8]) -> Option<Hello<'_>> {
        let (magic, rest) = body.split_first_chunk::<4>()?;
        let (version, rest) = rest.split_first_chunk::<2>()?;
        let (from, rest) = rest.split_first_chunk::<8>()?;
        let (to, rest) = rest.split_first_chunk::<8>()?;
        let (cluster, rest) = rest.split_first_chunk::<16>()?;
        let (len, credential) = rest.split_first_chunk::<2>()?;
        let ok = *magic == MAGIC
            && u16::from_be_bytes(*version) == VERSION
            && usize::from(u16::from_be_bytes(*len)) == credential.len();
        ok.then(|| Hello {
            from: u64::from_be_bytes(*from),
            to: u64::from_be_bytes(*to),
            cluster: u128::from_be_bytes(*cluster),
            credential,
        })
    }
}

/// The first bytes of the answer to a hello from a peer that is not a
/// member.
const NOT_MEMBER_MAGIC: [u8; 4] = *b"TKRN";

/// The answer to the hello of an authenticated peer that is not in the
/// answering member's configuration (PROTOCOL.md 4.4, "Removing"): who
/// answers, to whom, its cluster, and the applied index its configuration
/// is as of. The dialler decides what it means (`Replica::handle_not_member`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct NotMember {
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) cluster: u128,
    pub(super) index: u64,
}

impl NotMember {
    /// The answer as a frame, its length first.
    pub(super) fn frame(&self) -> Vec<u8> {
        let body: u32 = 4 + 2 + 8 + 8 + 16 + 8;
        let mut out = Vec::with_capacity(4 + body as usize);
        out.extend_from_slice(&body.to_be_bytes());
        out.extend_from_slice(&NOT_MEMBER_MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&self.from.to_be_bytes());
        out.extend_from_slice(&self.to.to_be_bytes());
        out.extend_from_slice(&self.cluster.to_be_bytes());
        out.extend_from_slice(&self.index.to_be_bytes());
        out
    }

    /// An answer's body, if it is one of these.
    pub(super) fn parse(body: &[u8]) -> Option<NotMember> {
        let (magic, rest) = body.split_first_chunk::<4>()?;
        let (version, rest) = rest.split_first_chunk::<2>()?;
        let (from, rest) = rest.split_first_chunk::<8>()?;
        let (to, rest) = rest.split_first_chunk::<8>()?;
        let (cluster, rest) = rest.split_first_chunk::<16>()?;
        let (index, rest) = rest.split_first_chunk::<8>()?;
        let ok = *magic == NOT_MEMBER_MAGIC && u16::from_be_bytes(*version) == VERSION;
        (ok && rest.is_empty()).then(|| NotMember {
            from: u64::from_be_bytes(*from),
            to: u64::from_be_bytes(*to),
            cluster: u128::from_be_bytes(*cluster),
            index: u64::from_be_bytes(*index),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_reads_back_and_nothing_else_does() {
        let hello = Hello {
            from: 3,
            to: 1,
            cluster: 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff,
            credential: b"abc",
        };
        let frame = hello.frame();
        // As the module's docs lay it out, byte for byte.
        let mut expected = vec![0, 0, 0, 43];
        expected.extend_from_slice(b"TKRP\x00\x02");
        expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1]);
        expected.extend((0..16).map(|i| i * 0x11));
        expected.extend_from_slice(b"\x00\x03abc");
        assert_eq!(frame, expected);
        assert_eq!(Hello::parse(&frame[4..]), Some(hello));
        for cut in 0..frame.len() - 4 {
            assert_eq!(Hello::parse(&frame[4..4 + cut]), None, "cut at {cut}");
        }
        let mut longer = frame[4..].to_vec();
        longer.push(0);
        assert_eq!(Hello::parse(&longer), None);
        let mut other = frame[4..].to_vec();
        other[5] = 1;
        assert_eq!(Hello::parse(&other), None, "version 1");
        other[5] = 3;
        assert_eq!(Hello::parse(&other), None, "version 3");
    }

    #[test]
    fn a_not_member_answer_reads_back_and_is_never_taken_for_a_hello() {
        let answer = NotMember {
            from: 2,
            to: 9,
            cluster: 7,
            index: 1_234,
        };
        let frame = answer.frame();
        assert_eq!(frame.len(), 4 + 46);
        assert_eq!(&frame[..4], &[0, 0, 0, 46]);
        assert_eq!(NotMember::parse(&frame[4..]), Some(answer));
        assert_eq!(Hello::parse(&frame[4..]), None);
        for cut in 0..frame.len() - 4 {
            assert_eq!(NotMember::parse(&frame[4..4 + cut]), None, "cut at {cut}");
        }
        let mut longer = frame[4..].to_vec();
        longer.push(0);
        assert_eq!(NotMember::parse(&longer), None);
        let hello = Hello {
            from: 3,
            to: 1,
            cluster: 7,
            credential: b"",
        };
        assert_eq!(NotMember::parse(&hello.frame()[4..]), None);
    }
}
