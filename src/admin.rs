//! The administrative frames of a replicated cluster (PROTOCOL.md 4.4, "Who
//! may ask"): their wire form is this implementation's, and this module is
//! its documentation. `ticketing cluster` (CLI.md) speaks it. It sits
//! beside [`crate::wire`], not in it: its frames are few and small, and it
//! reads them into owned values.
//!
//! An administrative connection is a connection to a member's client
//! address whose first line is an administrative hello, `HA`, instead of
//! `H`. The two never mix: an ordinary connection that sends an
//! administrative frame, or an administrative one that sends `H` or a
//! request of the lock protocol, breaks the framing and is closed. Lines
//! follow the rules of section 2 (printable ASCII, one space between
//! fields, `\n`, at most 1024 bytes); numbers are decimal without leading
//! zeros.
//!
//! ```text
//! client                               member
//! HA <version> <credential>            WA <member>           admitted (version 1)
//!                                      E <reason>            refused, then closed
//! Q <id> status                        SR <id> <member> <cluster> <leader> <term> <commit> <applied> <count>
//!                                      SM <id> <member> <role> <client> <peer> <reachable> <match> <lag> <applied>
//!                                      ... one SM per member, <count> in all
//! Q <id> transfer <member>|-           OK <id> transfer <member>
//! Q <id> add <member> <client> <peer>   OK <id> add <member>
//! Q <id> remove <member> force|-       OK <id> remove <member>
//! Q <id> snapshot                      SB <id> <cluster> <index> <floor> <count>
//!                                      SG <id> <key> <token> <remaining_ms>
//!                                      ... one SG per grant, <count> in all
//! any Q                                NO <id> <error> <address>|-
//! ```
//!
//! - The credential is the cluster's peer credential, or `-` where the
//!   members run without one (`--raft-insecure`, loopback only) or speak
//!   mutual TLS on their client addresses (the certificate the peer CA
//!   signed admits the operator: `AdminAccess::Certified`, feature
//!   `server`). A wrong one is answered `E auth_failed`; a server that is
//!   no member of a replicated cluster answers `E not_active`.
//! - `SR` is the answering member's view: its id, the cluster's identity
//!   (32 hex digits, `-` before one is committed), the leader it knows
//!   (`-`: none), the Raft term, and its commit and applied indices.
//! - Each `SM` is one member of the configuration: its role (`leader`,
//!   `follower`, `learner`), its client and peer addresses (`-` when not
//!   known), and, as the leader sees them (`-` elsewhere), whether it was
//!   heard from lately (`1`/`0`), its match index and how far it lags; its
//!   applied index is known for the answering member only.
//! - `transfer` hands the leadership to the member named, or to the most
//!   caught-up when `-`; `OK` says the transfer began, to whom. A member
//!   that does not lead refuses every change: `NO <id> not_leader` with
//!   the leader's client address when it knows one.
//! - `add` proposes a new member, reached at those addresses, as a learner
//!   (it is promoted once caught up); `remove` proposes a member's removal
//!   (`force`: even when the members that would remain do not answer).
//!   `OK` says the change was proposed; `status` tells when it is done. A
//!   leader asked to remove itself answers `NO <id> handing_over` with the
//!   client address of the member it hands over to, which is to be asked.
//! - `snapshot` asks for the leader's committed table at its applied
//!   index (PROTOCOL.md 4.4, "Backup and restore"): `SB` gives the
//!   cluster's identity (`-` before one), the index, the floor of its
//!   tokens and how many grants follow; each `SG` is one grant, in key
//!   order, with its token and the lease it has left. What `ticketing
//!   cluster snapshot` writes to its file (`ticketing::raft::Backup`,
//!   feature `raft`).
//! - `NO` carries the `error` values of CLI.md (`not_leader`,
//!   `unknown_member`, `not_caught_up`, ...) as an atom.

use thiserror::Error;

use crate::names::{Endpoint, Key, Name};
use crate::wire::Atom;

/// The version of the administrative frames this module speaks.
pub const ADMIN_VERSION: u64 = 1;

/// What is wrong with an administrative line.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AdminFrameError {
    /// Not printable ASCII, or fields not separated by exactly one space.
    #[error("not a line of atoms separated by single spaces")]
    Malformed,
    /// A kind this side does not receive, or the wrong fields for it.
    #[error("unknown administrative frame, or the wrong fields for its kind")]
    Unknown,
    /// A field that should be a number, an address, an identity or one of
    /// a few words, and is not.
    #[error("field {index} is not what its frame holds there")]
    Field {
        /// Its index, the kind being 0.
        index: usize,
    },
}

/// A frame a client sends on an administrative connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminRequest {
    /// `HA <version> <credential>`: the first line.
    Hello {
        /// The version of these frames the client speaks.
        version: u64,
        /// The peer credential, or `None` (`-`).
        credential: Option<Name>,
    },
    /// `Q <id> status`.
    Status {
        /// Request id, echoed in the answer.
        id: u64,
    },
    /// `Q <id> transfer <member>|-`.
    Transfer {
        /// Request id.
        id: u64,
        /// The member to hand over to; `None`: the most caught-up.
        to: Option<u64>,
    },
    /// `Q <id> add <member> <client> <peer>`.
    Add {
        /// Request id.
        id: u64,
        /// The new member's Raft id.
        member: u64,
        /// Where its clients reach it.
        client: Endpoint,
        /// Where its peers reach it.
        peer: Endpoint,
    },
    /// `Q <id> remove <member> force|-`.
    Remove {
        /// Request id.
        id: u64,
        /// The member to remove.
        member: u64,
        /// Even when the members that would remain do not answer.
        force: bool,
    },
    /// `Q <id> snapshot`.
    Snapshot {
        /// Request id.
        id: u64,
    },
}

/// A member's role, as `SM` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemberRole {
    /// It leads.
    Leader,
    /// It votes, and does not lead.
    Follower,
    /// It receives the log and does not vote.
    Learner,
}

impl MemberRole {
    /// Its word on the wire, and in `ticketing cluster status`.
    pub fn as_str(self) -> &'static str {
        match self {
            MemberRole::Leader => "leader",
            MemberRole::Follower => "follower",
            MemberRole::Learner => "learner",
        }
    }

    fn parse(s: &str) -> Option<MemberRole> {
        match s {
            "leader" => Some(MemberRole::Leader),
            "follower" => Some(MemberRole::Follower),
            "learner" => Some(MemberRole::Learner),
            _ => None,
        }
    }
}

/// `SR`: the answering member's view of its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusHead {
    /// Request id.
    pub id: u64,
    /// The answering member.
    pub member: u64,
    /// The cluster's identity (its 32 hex digits), once committed.
    pub cluster: Option<u128>,
    /// The leader the member knows.
    pub leader: Option<u64>,
    /// The Raft term.
    pub term: u64,
    /// The member's commit index.
    pub commit: u64,
    /// The member's applied index.
    pub applied: u64,
    /// How many `SM` lines follow.
    pub count: u64,
}

/// `SM`: one member of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusMember {
    /// Request id.
    pub id: u64,
    /// The member's Raft id.
    pub member: u64,
    /// Its role.
    pub role: MemberRole,
    /// The address its clients reach it at.
    pub client: Option<Endpoint>,
    /// The address its peers reach it at.
    pub peer: Option<Endpoint>,
    /// Whether the leader heard from it lately (the leader's view only).
    pub reachable: Option<bool>,
    /// Its match index (the leader's view only).
    pub matched: Option<u64>,
    /// How far its log lags the leader's (the leader's view only).
    pub lag: Option<u64>,
    /// Its applied index (the answering member's own only).
    pub applied: Option<u64>,
}

/// `SB`: the head of a snapshot of the committed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotHead {
    /// Request id.
    pub id: u64,
    /// The cluster's identity, once committed.
    pub cluster: Option<u128>,
    /// The applied index the table is at.
    pub index: u64,
    /// The floor of the cluster's tokens.
    pub floor: u64,
    /// How many `SG` lines follow.
    pub count: u64,
}

/// `SG`: one grant of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotGrant {
    /// Request id.
    pub id: u64,
    /// The key.
    pub key: Key,
    /// Its fencing token.
    pub token: u64,
    /// The lease it has left, in milliseconds.
    pub remaining_ms: u64,
}

/// A frame a member sends on an administrative connection.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminReply {
    /// `WA <member>`: the hello is admitted.
    Welcome {
        /// The member's Raft id.
        member: u64,
    },
    /// `SR ...`.
    Status(StatusHead),
    /// `SM ...`.
    Member(StatusMember),
    /// `OK <id> transfer <member>`: the transfer to it began.
    Transferring {
        /// Request id.
        id: u64,
        /// The member handed to.
        to: u64,
    },
    /// `OK <id> add <member>`: its addition was proposed.
    Adding {
        /// Request id.
        id: u64,
        /// The member.
        member: u64,
    },
    /// `OK <id> remove <member>`: its removal was proposed.
    Removing {
        /// Request id.
        id: u64,
        /// The member.
        member: u64,
    },
    /// `SB ...`.
    SnapshotHead(SnapshotHead),
    /// `SG ...`.
    SnapshotGrant(SnapshotGrant),
    /// `NO <id> <error> <leader>|-`: refused, and why.
    Refused {
        /// Request id.
        id: u64,
        /// The `error` value of CLI.md.
        error: Name,
        /// The leader's client address, when the member knows one.
        leader: Option<Endpoint>,
    },
    /// `E <reason>`: the connection is refused and closed.
    Error {
        /// The reason, as section 3 names it.
        reason: Name,
    },
}

/// The fields of `line` (without its `\n`): atoms separated by single
/// spaces.
fn fields(line: &[u8]) -> Result<Vec<&str>, AdminFrameError> {
    let text = core::str::from_utf8(line).map_err(|_| AdminFrameError::Malformed)?;
    let fields: Vec<&str> = text.split(' ').collect();
    if fields.iter().any(|f| Atom::new(f).is_err()) {
        return Err(AdminFrameError::Malformed);
    }
    Ok(fields)
}

fn number(fields: &[&str], index: usize) -> Result<u64, AdminFrameError> {
    let s = fields[index];
    let canonical = s == "0" || (!s.starts_with('0') && s.bytes().all(|b| b.is_ascii_digit()));
    canonical
        .then(|| s.parse().ok())
        .flatten()
        .ok_or(AdminFrameError::Field { index })
}

/// A number, or `-` for none.
fn maybe_number(fields: &[&str], index: usize) -> Result<Option<u64>, AdminFrameError> {
    match fields[index] {
        "-" => Ok(None),
        _ => number(fields, index).map(Some),
    }
}

fn maybe_endpoint(fields: &[&str], index: usize) -> Result<Option<Endpoint>, AdminFrameError> {
    match fields[index] {
        "-" => Ok(None),
        s => Endpoint::new(s)
            .map(Some)
            .map_err(|_| AdminFrameError::Field { index }),
    }
}

fn name(fields: &[&str], index: usize) -> Result<Name, AdminFrameError> {
    Name::new(fields[index]).map_err(|_| AdminFrameError::Field { index })
}

/// A cluster identity: 32 lowercase hex digits, or `-` for none.
fn cluster_field(s: &str, index: usize) -> Result<Option<u128>, AdminFrameError> {
    match s {
        "-" => Ok(None),
        hex if hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            u128::from_str_radix(hex, 16)
                .map(Some)
                .map_err(|_| AdminFrameError::Field { index })
        }
        _ => Err(AdminFrameError::Field { index }),
    }
}

fn cluster_text(cluster: Option<u128>) -> String {
    cluster.map_or_else(|| "-".to_string(), |c| format!("{c:032x}"))
}

fn dash_or<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

impl AdminRequest {
    /// Parses one line, without its `\n`.
    pub fn parse(line: &[u8]) -> Result<AdminRequest, AdminFrameError> {
        let f = fields(line)?;
        match f[..] {
            ["HA", _, credential] => Ok(AdminRequest::Hello {
                version: number(&f, 1)?,
                credential: match credential {
                    "-" => None,
                    _ => Some(name(&f, 2)?),
                },
            }),
            ["Q", _, "status"] => Ok(AdminRequest::Status { id: number(&f, 1)? }),
            ["Q", _, "transfer", _] => Ok(AdminRequest::Transfer {
                id: number(&f, 1)?,
                to: maybe_number(&f, 3)?,
            }),
            ["Q", _, "add", _, client, peer] => Ok(AdminRequest::Add {
                id: number(&f, 1)?,
                member: number(&f, 3)?,
                client: Endpoint::new(client).map_err(|_| AdminFrameError::Field { index: 4 })?,
                peer: Endpoint::new(peer).map_err(|_| AdminFrameError::Field { index: 5 })?,
            }),
            ["Q", _, "remove", _, force] => Ok(AdminRequest::Remove {
                id: number(&f, 1)?,
                member: number(&f, 3)?,
                force: match force {
                    "force" => true,
                    "-" => false,
                    _ => return Err(AdminFrameError::Field { index: 4 }),
                },
            }),
            ["Q", _, "snapshot"] => Ok(AdminRequest::Snapshot { id: number(&f, 1)? }),
            _ => Err(AdminFrameError::Unknown),
        }
    }

    /// Appends the frame's line, `\n` included.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let line = match self {
            AdminRequest::Hello {
                version,
                credential,
            } => format!(
                "HA {version} {}",
                credential.as_ref().map_or("-", Name::as_str)
            ),
            AdminRequest::Status { id } => format!("Q {id} status"),
            AdminRequest::Transfer { id, to } => format!("Q {id} transfer {}", dash_or(*to)),
            AdminRequest::Add {
                id,
                member,
                client,
                peer,
            } => format!("Q {id} add {member} {} {}", client.as_str(), peer.as_str()),
            AdminRequest::Remove { id, member, force } => format!(
                "Q {id} remove {member} {}",
                if *force { "force" } else { "-" }
            ),
            AdminRequest::Snapshot { id } => format!("Q {id} snapshot"),
        };
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

impl AdminReply {
    /// Parses one line, without its `\n`.
    pub fn parse(line: &[u8]) -> Result<AdminReply, AdminFrameError> {
        let f = fields(line)?;
        match f[..] {
            ["WA", _] => Ok(AdminReply::Welcome {
                member: number(&f, 1)?,
            }),
            ["SR", _, _, cluster, _, _, _, _, _] => Ok(AdminReply::Status(StatusHead {
                id: number(&f, 1)?,
                member: number(&f, 2)?,
                cluster: cluster_field(cluster, 3)?,
                leader: maybe_number(&f, 4)?,
                term: number(&f, 5)?,
                commit: number(&f, 6)?,
                applied: number(&f, 7)?,
                count: number(&f, 8)?,
            })),
            ["SM", _, _, role, _, _, reachable, _, _, _] => Ok(AdminReply::Member(StatusMember {
                id: number(&f, 1)?,
                member: number(&f, 2)?,
                role: MemberRole::parse(role).ok_or(AdminFrameError::Field { index: 3 })?,
                client: maybe_endpoint(&f, 4)?,
                peer: maybe_endpoint(&f, 5)?,
                reachable: match reachable {
                    "1" => Some(true),
                    "0" => Some(false),
                    "-" => None,
                    _ => return Err(AdminFrameError::Field { index: 6 }),
                },
                matched: maybe_number(&f, 7)?,
                lag: maybe_number(&f, 8)?,
                applied: maybe_number(&f, 9)?,
            })),
            ["OK", _, "transfer", _] => Ok(AdminReply::Transferring {
                id: number(&f, 1)?,
                to: number(&f, 3)?,
            }),
            ["OK", _, "add", _] => Ok(AdminReply::Adding {
                id: number(&f, 1)?,
                member: number(&f, 3)?,
            }),
            ["OK", _, "remove", _] => Ok(AdminReply::Removing {
                id: number(&f, 1)?,
                member: number(&f, 3)?,
            }),
            ["SB", _, cluster, _, _, _] => Ok(AdminReply::SnapshotHead(SnapshotHead {
                id: number(&f, 1)?,
                cluster: cluster_field(cluster, 2)?,
                index: number(&f, 3)?,
                floor: number(&f, 4)?,
                count: number(&f, 5)?,
            })),
            ["SG", _, key, _, _] => Ok(AdminReply::SnapshotGrant(SnapshotGrant {
                id: number(&f, 1)?,
                key: Key::new(key).map_err(|_| AdminFrameError::Field { index: 2 })?,
                token: match number(&f, 3)? {
                    0 => return Err(AdminFrameError::Field { index: 3 }),
                    token => token,
                },
                remaining_ms: number(&f, 4)?,
            })),
            ["NO", _, _, _] => Ok(AdminReply::Refused {
                id: number(&f, 1)?,
                error: name(&f, 2)?,
                leader: maybe_endpoint(&f, 3)?,
            }),
            ["E", _] => Ok(AdminReply::Error {
                reason: name(&f, 1)?,
            }),
            _ => Err(AdminFrameError::Unknown),
        }
    }

    /// Appends the frame's line, `\n` included.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let line = match self {
            AdminReply::Welcome { member } => format!("WA {member}"),
            AdminReply::Status(s) => format!(
                "SR {} {} {} {} {} {} {} {}",
                s.id,
                s.member,
                cluster_text(s.cluster),
                dash_or(s.leader),
                s.term,
                s.commit,
                s.applied,
                s.count
            ),
            AdminReply::Member(m) => format!(
                "SM {} {} {} {} {} {} {} {} {}",
                m.id,
                m.member,
                m.role.as_str(),
                dash_or(m.client.as_ref().map(Endpoint::as_str)),
                dash_or(m.peer.as_ref().map(Endpoint::as_str)),
                dash_or(m.reachable.map(u8::from)),
                dash_or(m.matched),
                dash_or(m.lag),
                dash_or(m.applied)
            ),
            AdminReply::Transferring { id, to } => format!("OK {id} transfer {to}"),
            AdminReply::Adding { id, member } => format!("OK {id} add {member}"),
            AdminReply::Removing { id, member } => format!("OK {id} remove {member}"),
            AdminReply::SnapshotHead(h) => format!(
                "SB {} {} {} {} {}",
                h.id,
                cluster_text(h.cluster),
                h.index,
                h.floor,
                h.count
            ),
            AdminReply::SnapshotGrant(g) => format!(
                "SG {} {} {} {}",
                g.id,
                g.key.as_str(),
                g.token,
                g.remaining_ms
            ),
            AdminReply::Refused { id, error, leader } => format!(
                "NO {id} {} {}",
                error.as_str(),
                dash_or(leader.as_ref().map(Endpoint::as_str))
            ),
            AdminReply::Error { reason } => format!("E {}", reason.as_str()),
        };
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip_request(line: &str) -> AdminRequest {
        let frame = AdminRequest::parse(line.as_bytes()).expect(line);
        let mut out = Vec::new();
        frame.encode(&mut out);
        assert_eq!(out, format!("{line}\n").as_bytes(), "canonical");
        frame
    }

    fn round_trip_reply(line: &str) -> AdminReply {
        let frame = AdminReply::parse(line.as_bytes()).expect(line);
        let mut out = Vec::new();
        frame.encode(&mut out);
        assert_eq!(out, format!("{line}\n").as_bytes(), "canonical");
        frame
    }

    #[test]
    fn every_request_reads_back_from_its_own_line() {
        assert_eq!(
            round_trip_request("HA 1 s3cret"),
            AdminRequest::Hello {
                version: 1,
                credential: Some(Name::new("s3cret").unwrap())
            }
        );
        assert_eq!(
            round_trip_request("HA 1 -"),
            AdminRequest::Hello {
                version: 1,
                credential: None
            }
        );
        assert_eq!(
            round_trip_request("Q 7 status"),
            AdminRequest::Status { id: 7 }
        );
        assert_eq!(
            round_trip_request("Q 8 transfer 3"),
            AdminRequest::Transfer { id: 8, to: Some(3) }
        );
        assert_eq!(
            round_trip_request("Q 9 transfer -"),
            AdminRequest::Transfer { id: 9, to: None }
        );
        assert_eq!(
            round_trip_request("Q 10 add 4 127.0.0.1:7004 127.0.0.1:7104"),
            AdminRequest::Add {
                id: 10,
                member: 4,
                client: Endpoint::new("127.0.0.1:7004").unwrap(),
                peer: Endpoint::new("127.0.0.1:7104").unwrap(),
            }
        );
        assert_eq!(
            round_trip_request("Q 11 remove 2 force"),
            AdminRequest::Remove {
                id: 11,
                member: 2,
                force: true
            }
        );
        round_trip_request("Q 12 remove 2 -");
        assert_eq!(
            round_trip_request("Q 13 snapshot"),
            AdminRequest::Snapshot { id: 13 }
        );
    }

    #[test]
    fn every_reply_reads_back_from_its_own_line() {
        round_trip_reply("WA 2");
        let head = round_trip_reply("SR 1 2 000000000000000000000000000000ff 3 5 120 118 3");
        let AdminReply::Status(head) = head else {
            panic!("{head:?}")
        };
        assert_eq!((head.cluster, head.leader), (Some(255), Some(3)));
        round_trip_reply("SR 1 2 - - 1 0 0 0");
        let m = round_trip_reply("SM 1 2 learner 127.0.0.1:7001 127.0.0.1:7101 1 118 2 -");
        let AdminReply::Member(m) = m else {
            panic!("{m:?}")
        };
        assert_eq!(
            (m.role, m.reachable, m.matched, m.lag, m.applied),
            (MemberRole::Learner, Some(true), Some(118), Some(2), None)
        );
        round_trip_reply("SM 1 3 follower - - - - - 40");
        round_trip_reply("OK 4 transfer 2");
        round_trip_reply("OK 7 add 4");
        round_trip_reply("OK 8 remove 2");
        round_trip_reply("NO 9 handing_over 127.0.0.1:7002");
        round_trip_reply("NO 5 not_leader 127.0.0.1:7003");
        round_trip_reply("NO 6 unknown_member -");
        round_trip_reply("E auth_failed");
        let head = round_trip_reply("SB 3 000000000000000000000000000000ff 120 1700000000000 2");
        assert_eq!(
            head,
            AdminReply::SnapshotHead(SnapshotHead {
                id: 3,
                cluster: Some(255),
                index: 120,
                floor: 1_700_000_000_000,
                count: 2
            })
        );
        round_trip_reply("SB 3 - 0 0 0");
        let grant = round_trip_reply("SG 3 orders/7 7130316800000000001 2500");
        assert_eq!(
            grant,
            AdminReply::SnapshotGrant(SnapshotGrant {
                id: 3,
                key: Key::new("orders/7").unwrap(),
                token: 7_130_316_800_000_000_001,
                remaining_ms: 2_500
            })
        );
    }

    #[test]
    fn lines_that_break_a_rule_are_refused() {
        for line in [
            "",
            "HA  1 x",
            "HA 1 x ",
            "HA 01 x",
            "HA 1",
            "Q 1 status extra",
            "Q x status",
            "Q 1 transfer",
            "Q 1 transfer 0x3",
            "Q 1 reboot",
            "Q 1 add 4 127.0.0.1:7004",
            "Q 1 add 4 nohost 127.0.0.1:7104",
            "Q 1 remove 2",
            "Q 1 remove 2 yes",
            "H 2 c -",
            "A 1 k o 0 1000",
            "Q 1 status\r",
            "Q 18446744073709551616 status",
            "Q 1 snapshot now",
        ] {
            assert!(AdminRequest::parse(line.as_bytes()).is_err(), "{line:?}");
        }
        for line in [
            "WA",
            "SR 1 2 ff 3 5 120 118 3",
            "SR 1 2 000000000000000000000000000000FF 3 5 120 118 3",
            "SM 1 2 boss - - - - - -",
            "SM 1 2 leader - - 2 - - -",
            "SM 1 2 leader nohost - - - - -",
            "OK 1 transfer -",
            "NO 1 not_leader",
            "G 1 A k 7 1000 0",
            "SB 1 - 5 7",
            "SB 1 ff 5 7 0",
            "SG 1 k 0 1000",
            "SG 1 k 7",
            "SG 1 k 7 01",
        ] {
            assert!(AdminReply::parse(line.as_bytes()).is_err(), "{line:?}");
        }
    }
}
