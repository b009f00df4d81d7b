//! What happens in a run, one [`Step`] at a time, and its byte encoding.

use core::time::Duration;

use arbitrary::Unstructured;

use super::{byte, ep};
use crate::client::{Action, Client, Config, Event, Grant, Outcome};
use crate::names::{Key, Name};
use crate::time::Time;

/// One thing that happens in a run. Numbers are read modulo the size of
/// their range; a step that cannot apply does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The embedder acquires [`KEYS`](super::KEYS)`[key % 4]`, waiting
    /// [`WAITS_MS`](super::WAITS_MS)`[wait % 8]`, for a lease of [`LEASES_MS`](super::LEASES_MS)`[lease % 8]`,
    /// with an owner of its own.
    Acquire {
        /// Which key.
        key: u8,
        /// Which wait budget.
        wait: u8,
        /// Which lease.
        lease: u8,
    },
    /// The embedder releases grant `pick % n` of those it holds; with
    /// `pick >= 128`, one it already gave back (the client must refuse it,
    /// or end it at once if it has expired).
    Release {
        /// Which grant.
        pick: u8,
    },
    /// The embedder releases a raw `(key, token)`.
    ReleaseToken {
        /// [`KEYS`](super::KEYS)`[key % 6]`.
        key: u8,
        /// The token.
        token: u8,
    },
    /// The embedder cancels operation `pick % n` of all it ever submitted.
    Cancel {
        /// Which operation.
        pick: u8,
    },
    /// The embedder hands back grant `pick % n` as undeliverable.
    Undeliverable {
        /// Which grant.
        pick: u8,
    },
    /// The embedder shuts down with [`BUDGETS_MS`](super::BUDGETS_MS)`[budget % 6]`.
    Shutdown {
        /// Which budget.
        budget: u8,
    },
    /// The pending connect succeeds (the server accepts it).
    Connected,
    /// The pending connect fails (or, on a connected transport, it fails).
    ConnectFailed,
    /// The server reads `bytes` bytes of what the client sent (0: all).
    ServerReads {
        /// How many.
        bytes: u8,
    },
    /// The server sends `frames` frames, each picked at random among those
    /// it could send (0: all).
    ServerEmits {
        /// How many.
        frames: u8,
    },
    /// The network delivers `bytes` bytes of what the server sent (0: all);
    /// when nothing is left and the server has closed, the end of stream.
    Deliver {
        /// How many.
        bytes: u8,
    },
    /// The server injects a fault, `kind % 17`: `L` to an allowlisted or a
    /// foreign address (0, 1), `M` likewise (2, 3), `E no_leader`,
    /// `not_active`, `auth_failed`, another reason (4 to 7), a duplicate
    /// answer (8), a `G` to an unknown id (9), an answer naming another key
    /// (10), a `G` (to an acquire or a renewal) with a longer lease than
    /// asked (11), a dropped transport (12), a `T` to an unknown id (13), a
    /// `G` to an acquire without `waited_ms` (14) or with more than it
    /// asked (15), a `G` to a renewal with another token (16).
    Fault {
        /// Which fault.
        kind: u8,
    },
    /// A forged frame is put on the wire behind what the server sent:
    /// `kind % 13` is `G .. A` (with `waited_ms` 0), `T`, `B`, `D`,
    /// `N .. R` (0 to 4), an answer with the wrong op letter (5), `W` (6),
    /// `L` (7), `G .. X` (8: with the request's own token if `token < 128`
    /// and it was a renewal, else `token`), `N .. X` (9), `G .. A` without
    /// `waited_ms` (10), `G .. A` that waited `token * 50` ms (11), a
    /// `T`, `D` or `B` to a renewal (12). `id < 200` answers one of the
    /// recent requests, else an id never sent; `key < 128` names that
    /// request's key, else [`KEYS`](super::KEYS)`[key % 6]`.
    Forge {
        /// Which frame.
        kind: u8,
        /// Which id.
        id: u8,
        /// Which key.
        key: u8,
        /// The token of a `G`.
        token: u8,
        /// The lease of a `G`: [`LEASES_MS`](super::LEASES_MS)`[lease % 8]`.
        lease: u8,
    },
    /// Raw bytes are handed to the client on its current connection, in
    /// whatever phase it is.
    Raw {
        /// The bytes (at most 255).
        data: Vec<u8>,
    },
    /// The transport ends: end of stream, or an error.
    TransportClosed {
        /// An error rather than an end of stream.
        error: bool,
    },
    /// Time passes by `ms` milliseconds. With an even `ms` the client is
    /// told at once; with an odd one it learns it from its next input (a
    /// late driver).
    Advance {
        /// How long.
        ms: u16,
    },
    /// Time jumps to the earliest deadline of the client or the server.
    NextDeadline,
    /// As [`Step::Acquire`], renewed automatically once granted, for at
    /// most [`RENEW_LIMITS_MS`](super::RENEW_LIMITS_MS)`[limit % 8]` (`acquire_renewing`).
    AcquireRenewing {
        /// Which key.
        key: u8,
        /// Which wait budget.
        wait: u8,
        /// Which lease.
        lease: u8,
        /// Which limit.
        limit: u8,
    },
    /// The embedder renews grant `pick % n` of those it holds once (with
    /// `pick >= 128`, one it gave back: refused), asking for the acquire's
    /// lease (`lease % 9 == 8`) or [`LEASES_MS`](super::LEASES_MS)`[lease % 9]`.
    Renew {
        /// Which grant.
        pick: u8,
        /// Which lease.
        lease: u8,
    },
    /// The embedder starts renewing grant `pick % n` automatically, for at
    /// most [`RENEW_LIMITS_MS`](super::RENEW_LIMITS_MS)`[limit % 8]` from now.
    AutoRenew {
        /// Which grant.
        pick: u8,
        /// Which limit.
        limit: u8,
    },
    /// The embedder stops renewing grant `pick % n` automatically.
    StopRenewing {
        /// Which grant.
        pick: u8,
    },
    /// A flood of `L` lines is put on the wire behind what the server sent:
    /// `1 + 16 * count` of them, naming [`FLOOD_ADDRS`](super::FLOOD_ADDRS)`[kind % 5]`, or
    /// (with `kind >= 128`) each in turn. The client must keep the
    /// connection and tell the embedder only of hints that change
    /// something.
    HintFlood {
        /// How many.
        count: u8,
        /// Which addresses.
        kind: u8,
    },
    /// A grant issued by another client, with the key, token and handle of
    /// the embedder's grant `pick % n` (or of [`KEYS`](super::KEYS)`[pick % 6]` if it
    /// holds none), is handed to `release`, `undeliverable`, `renew`,
    /// `auto_renew` or `stop_renewing` (`what % 5`): it must be refused with
    /// `Error::ForeignGrant` and change nothing.
    Foreign {
        /// Which grant to mimic.
        pick: u8,
        /// Which call.
        what: u8,
    },
}

impl Step {
    /// How many kinds of step there are.
    pub const KINDS: u8 = 23;

    /// Reads one step: a kind byte (modulo [`Step::KINDS`]), then one byte
    /// per field (`Advance`: two, little-endian; `Raw`: a length, then
    /// that many bytes or what is left). `None` when the input is used up.
    pub fn decode(u: &mut Unstructured<'_>) -> Option<Step> {
        if u.is_empty() {
            return None;
        }
        let kind = byte(u) % Step::KINDS;
        Some(match kind {
            0 => Step::Acquire {
                key: byte(u),
                wait: byte(u),
                lease: byte(u),
            },
            1 => Step::Release { pick: byte(u) },
            2 => Step::ReleaseToken {
                key: byte(u),
                token: byte(u),
            },
            3 => Step::Cancel { pick: byte(u) },
            4 => Step::Undeliverable { pick: byte(u) },
            5 => Step::Shutdown { budget: byte(u) },
            6 => Step::Connected,
            7 => Step::ConnectFailed,
            8 => Step::ServerReads { bytes: byte(u) },
            9 => Step::ServerEmits { frames: byte(u) },
            10 => Step::Deliver { bytes: byte(u) },
            11 => Step::Fault { kind: byte(u) },
            12 => Step::Forge {
                kind: byte(u),
                id: byte(u),
                key: byte(u),
                token: byte(u),
                lease: byte(u),
            },
            13 => {
                let len = usize::from(byte(u)).min(u.len());
                Step::Raw {
                    data: u.bytes(len).unwrap_or_default().to_vec(),
                }
            }
            14 => Step::TransportClosed {
                error: byte(u) & 1 != 0,
            },
            15 => Step::Advance {
                ms: u16::from_le_bytes([byte(u), byte(u)]),
            },
            16 => Step::NextDeadline,
            17 => Step::AcquireRenewing {
                key: byte(u),
                wait: byte(u),
                lease: byte(u),
                limit: byte(u),
            },
            18 => Step::Renew {
                pick: byte(u),
                lease: byte(u),
            },
            19 => Step::AutoRenew {
                pick: byte(u),
                limit: byte(u),
            },
            20 => Step::StopRenewing { pick: byte(u) },
            21 => Step::HintFlood {
                count: byte(u),
                kind: byte(u),
            },
            _ => Step::Foreign {
                pick: byte(u),
                what: byte(u),
            },
        })
    }

    /// The inverse of [`Step::decode`] (a `Raw` step keeps at most 255
    /// bytes).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Step::Acquire { key, wait, lease } => out.extend_from_slice(&[0, *key, *wait, *lease]),
            Step::Release { pick } => out.extend_from_slice(&[1, *pick]),
            Step::ReleaseToken { key, token } => out.extend_from_slice(&[2, *key, *token]),
            Step::Cancel { pick } => out.extend_from_slice(&[3, *pick]),
            Step::Undeliverable { pick } => out.extend_from_slice(&[4, *pick]),
            Step::Shutdown { budget } => out.extend_from_slice(&[5, *budget]),
            Step::Connected => out.push(6),
            Step::ConnectFailed => out.push(7),
            Step::ServerReads { bytes } => out.extend_from_slice(&[8, *bytes]),
            Step::ServerEmits { frames } => out.extend_from_slice(&[9, *frames]),
            Step::Deliver { bytes } => out.extend_from_slice(&[10, *bytes]),
            Step::Fault { kind } => out.extend_from_slice(&[11, *kind]),
            Step::Forge {
                kind,
                id,
                key,
                token,
                lease,
            } => out.extend_from_slice(&[12, *kind, *id, *key, *token, *lease]),
            Step::Raw { data } => {
                let data = &data[..data.len().min(255)];
                out.push(13);
                out.push(data.len() as u8);
                out.extend_from_slice(data);
            }
            Step::TransportClosed { error } => out.extend_from_slice(&[14, u8::from(*error)]),
            Step::Advance { ms } => {
                out.push(15);
                out.extend_from_slice(&ms.to_le_bytes());
            }
            Step::NextDeadline => out.push(16),
            Step::AcquireRenewing {
                key,
                wait,
                lease,
                limit,
            } => out.extend_from_slice(&[17, *key, *wait, *lease, *limit]),
            Step::Renew { pick, lease } => out.extend_from_slice(&[18, *pick, *lease]),
            Step::AutoRenew { pick, limit } => out.extend_from_slice(&[19, *pick, *limit]),
            Step::StopRenewing { pick } => out.extend_from_slice(&[20, *pick]),
            Step::HintFlood { count, kind } => out.extend_from_slice(&[21, *count, *kind]),
            Step::Foreign { pick, what } => out.extend_from_slice(&[22, *pick, *what]),
        }
    }
}

/// A grant of `key` with `token` and `lease_ms`, issued by a client of its
/// own (so with the same handle as the first grant of any client), for
/// handing to a client that did not issue it.
///
/// The issuing client is driven in the order the driver contract asks:
/// its `H` is handed out before the `W` comes, and its `A` before the `G`
/// (an answer to a request not yet handed out would be a stray).
pub fn foreign_grant(key: &str, token: u64, lease_ms: u64) -> Option<Grant> {
    let config = Config::new([ep("f:9")], Name::new("foreign").ok()?);
    let key = Key::new(key).ok()?;
    let now = Time::ZERO;
    let mut client = Client::new(config, now).ok()?;
    let conn = std::iter::from_fn(|| client.poll_action()).find_map(|action| match action {
        Action::Connect { conn, .. } => Some(conn),
        _ => None,
    })?;
    client.handle_connected(now, conn);
    while client.poll_action().is_some() {}
    client.handle_bytes(now, conn, b"W f 4\n");
    let op = client
        .acquire(
            now,
            key.clone(),
            Name::new("f").ok()?,
            Duration::ZERO,
            Duration::from_millis(lease_ms.max(1)),
        )
        .ok()?;
    while client.poll_action().is_some() {}
    let answer = format!("G 1 A {key} {token} {} 0\n", lease_ms.max(1));
    client.handle_bytes(now, conn, answer.as_bytes());
    std::iter::from_fn(|| client.poll_event()).find_map(|event| match event {
        Event::Outcome {
            op: done,
            outcome: Outcome::Granted(grant),
        } if done == op => Some(grant),
        _ => None,
    })
}
