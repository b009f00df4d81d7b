//! The body of the cargo-fuzz target `peer_frames` (features `fuzzing` and
//! `raft`): arbitrary frames from authenticated peers into the members of a
//! replicated cluster (PROTOCOL.md 4.3, "Peers are authenticated, always").
//!
//! Three [`Replica`]s on [`MemoryDisk`]s, on one fake clock, their
//! messages to each other delivered at once and their writes durable at
//! the next step. The input sets the cluster up, then is read as steps:
//! frames from a peer (bytes decoded as a `raft::eraftpb::Message`, as a
//! peer link decodes them, and addressed as a link addresses them: from
//! the link's member, to this one), honest time passing, and client
//! requests that move the log. Whatever the frames, no member's engine
//! may fail, no member may stop on an entry it cannot read, at most one
//! may serve at a time, and the same input gives the same cluster twice
//! (invariant 6).

use core::time::Duration;
use std::collections::BTreeMap;
use std::fmt;

use prost::Message as _;
use raft::prelude::Message;

use crate::names::{Endpoint, Name};
use crate::server::raft::{
    MemoryDisk, Output, Replica, ReplicaConfig, ReplicaEvent, Restored, ELECTION_TICKS,
};
use crate::server::{Action, Config, ConnId, Server};
use crate::time::Time;

/// The most steps one input runs.
pub const MAX_PEER_STEPS: usize = 300;

const MEMBERS: u64 = 3;
const STEP: Duration = Duration::from_millis(10);
const ELECTION_TIMEOUT: Duration = Duration::from_millis(100);

/// A rule a forged frame broke: what happened, after which step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("peer frames: {0}")]
pub struct PeerFailure(pub String);

/// Runs `data` twice (see the module's documentation): `Err` names the
/// first rule broken.
pub fn peer_frames(data: &[u8]) -> Result<(), PeerFailure> {
    let first = Trio::run(data)?;
    let second = Trio::run(data)?;
    if first != second {
        return Err(PeerFailure(
            "the same frames at the same times gave two clusters (invariant 6)".to_string(),
        ));
    }
    Ok(())
}

/// One step read from the input.
#[derive(Debug)]
enum Step<'a> {
    /// Bytes from member `from`'s link into member `to`.
    Frame { to: u64, from: u64, bytes: &'a [u8] },
    /// Honest time passing.
    Wait(Duration),
    /// A client of the leader asks for key `key`, or gives it back.
    Client { key: u8 },
}

fn steps(mut data: &[u8]) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    while let [op, rest @ ..] = data {
        data = rest;
        out.push(match *op {
            0..=199 => {
                let to = u64::from(op % 3) + 1;
                let from = (to + u64::from(op / 3 % 2)) % MEMBERS + 1;
                let Some((&len, rest)) = data.split_first() else {
                    break;
                };
                let len = usize::from(len).min(rest.len());
                let (bytes, rest) = rest.split_at(len);
                data = rest;
                Step::Frame { to, from, bytes }
            }
            200..=239 => Step::Wait(STEP * u32::from(op - 199)),
            _ => Step::Client { key: op % 4 },
        });
        if out.len() == MAX_PEER_STEPS {
            break;
        }
    }
    out
}

/// What a run leaves to compare: every event, and every byte a client was
/// sent.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    events: Vec<(u64, ReplicaEvent)>,
    sent: BTreeMap<(u64, ConnId), Vec<u8>>,
}

/// Three members on one clock.
struct Trio {
    now: Time,
    replicas: BTreeMap<u64, Replica>,
    disks: BTreeMap<u64, MemoryDisk>,
    syncing: Vec<u64>,
    events: Vec<(u64, ReplicaEvent)>,
    sent: BTreeMap<(u64, ConnId), Vec<u8>>,
    /// Each member's client connection, once made.
    clients: BTreeMap<u64, ConnId>,
    next_id: u64,
}

impl fmt::Debug for Trio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trio")
            .field("now", &self.now)
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl Trio {
    fn run(data: &[u8]) -> Result<Outcome, PeerFailure> {
        let (setup, rest) = data.split_first().unwrap_or((&0, &[]));
        let snapshot_every = [4, 16, 10_000, 10_000][usize::from(setup & 3)];
        let mut trio = Trio::new(snapshot_every, setup & 4 != 0);
        trio.advance(Duration::from_secs(1))?;
        for key in 0..(setup >> 3) % 8 {
            trio.client(key)?;
            trio.advance(STEP * 5)?;
        }
        for (i, step) in steps(rest).into_iter().enumerate() {
            match step {
                Step::Frame { to, from, bytes } => {
                    // What a link hands over: a frame that decodes, from
                    // its member, to this one (others it drops).
                    if let Ok(mut m) = Message::decode(bytes) {
                        (m.from, m.to) = (from, to);
                        let now = trio.now;
                        if let Some(r) = trio.replicas.get_mut(&to) {
                            r.handle_message(now, m);
                        }
                        trio.settle();
                    }
                }
                Step::Wait(d) => trio.advance(d)?,
                Step::Client { key } => trio.client(key)?,
            }
            trio.check()
                .map_err(|why| PeerFailure(format!("step {i}: {why}")))?;
        }
        trio.advance(Duration::from_secs(3))?;
        Ok(Outcome {
            events: trio.events,
            sent: trio.sent,
        })
    }

    fn new(snapshot_every: u64, defer: bool) -> Trio {
        let members: BTreeMap<u64, Endpoint> = (1..=MEMBERS)
            .map(|id| {
                (
                    id,
                    Endpoint::new(format!("10.0.0.{id}:7878")).expect("an address"),
                )
            })
            .collect();
        let mut trio = Trio {
            now: Time::ZERO,
            replicas: BTreeMap::new(),
            disks: BTreeMap::new(),
            syncing: Vec::new(),
            events: Vec::new(),
            sent: BTreeMap::new(),
            clients: BTreeMap::new(),
            next_id: 1,
        };
        for id in 1..=MEMBERS {
            let disk = MemoryDisk::new(Restored::new_cluster(1..=MEMBERS));
            let name = Name::new(format!("n{id}")).expect("an atom");
            let server = Server::new(Config::new(name), Time::ZERO).expect("a valid config");
            let mut config =
                ReplicaConfig::new(id, members.clone(), ELECTION_TIMEOUT, 1_700_000_000_000);
            // Distinct, so that the first election needs no draw.
            config.pinned_election_ticks = Some(ELECTION_TICKS + 1 + 3 * id as usize);
            config.snapshot_every = snapshot_every;
            config.draw = u128::from(id);
            let mut replica = Replica::new(config, server, disk.restored(), Time::ZERO)
                .expect("a member of a new cluster");
            if defer && id == 2 {
                replica.defer_apply();
            }
            trio.replicas.insert(id, replica);
            trio.disks.insert(id, disk);
        }
        trio
    }

    /// Drains every member's output, delivering messages at once.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            for id in 1..=MEMBERS {
                while let Some(out) = self.replicas.get_mut(&id).and_then(Replica::poll_output) {
                    moved = true;
                    match out {
                        Output::Client(Action::Send { conn, data }) => self
                            .sent
                            .entry((id, conn))
                            .or_default()
                            .extend_from_slice(&data),
                        Output::Client(_) => {}
                        Output::Persist(p) => {
                            if let Some(disk) = self.disks.get_mut(&id) {
                                disk.persist(&p);
                            }
                            self.syncing.push(id);
                        }
                        Output::Compact(s) => {
                            if let Some(disk) = self.disks.get_mut(&id) {
                                disk.compact(&s);
                            }
                        }
                        Output::Send(m) => {
                            let now = self.now;
                            if let Some(r) = self.replicas.get_mut(&m.to) {
                                r.handle_message(now, m);
                            }
                        }
                        Output::Event(e) => self.events.push((id, e)),
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Honest time: writes become durable, timers fire, copies catch up.
    fn advance(&mut self, d: Duration) -> Result<(), PeerFailure> {
        let end = self.now.saturating_add(d);
        while self.now < end {
            self.now = self.now.saturating_add(STEP);
            let now = self.now;
            for id in core::mem::take(&mut self.syncing) {
                if let Some(r) = self.replicas.get_mut(&id) {
                    r.handle_persisted(now);
                }
            }
            for r in self.replicas.values_mut() {
                r.handle_timeout(now);
                if r.has_deferred() {
                    r.handle_deferred(now);
                }
            }
            self.settle();
            self.check().map_err(PeerFailure)?;
        }
        Ok(())
    }

    /// A request on a connection to the serving member, if one serves: an
    /// acquire of `key`, or the release of its grant once granted.
    fn client(&mut self, key: u8) -> Result<(), PeerFailure> {
        let now = self.now;
        let Some((&id, _)) = self.replicas.iter().find(|(_, r)| r.is_serving()) else {
            return Ok(());
        };
        let r = self.replicas.get_mut(&id).expect("it serves");
        let conn = match self.clients.get(&id) {
            Some(&conn) if r.server().is_open(conn) => conn,
            _ => {
                let conn = r.handle_accept(now);
                r.handle_bytes(now, conn, b"H 2 fuzz -\n");
                self.clients.insert(id, conn);
                conn
            }
        };
        let answered = self.sent.get(&(id, conn)).map_or(&[][..], Vec::as_slice);
        let token = String::from_utf8_lossy(answered)
            .lines()
            .rev()
            .find_map(|l| {
                let rest = l.strip_prefix("G ")?;
                let mut fields = rest.split(' ').skip(2);
                (fields.next()? == format!("k{key}")).then(|| fields.next()?.parse::<u64>().ok())?
            });
        let request = match token {
            Some(token) => format!("R {} k{key} {token}\n", self.next_id),
            None => format!("A {} k{key} fuzz 0 60000\n", self.next_id),
        };
        self.next_id += 1;
        r.handle_bytes(now, conn, request.as_bytes());
        self.settle();
        self.check().map_err(PeerFailure)
    }

    /// What no frame may bring about.
    fn check(&self) -> Result<(), String> {
        for (id, e) in &self.events {
            match e {
                ReplicaEvent::Failed { peer } => {
                    return Err(format!(
                        "member {id}'s engine failed on a message from member {peer}"
                    ))
                }
                ReplicaEvent::BadEntry { index } => {
                    return Err(format!(
                        "member {id} stopped on entry {index}, which it could not read"
                    ))
                }
                _ => {}
            }
        }
        let serving = self.replicas.values().filter(|r| r.is_serving()).count();
        if serving > 1 {
            return Err(format!("{serving} members serve at once: {self:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(to_op: u8, m: &Message) -> Vec<u8> {
        let bytes = m.encode_to_vec();
        let mut out = vec![to_op, u8::try_from(bytes.len()).expect("a short message")];
        out.extend_from_slice(&bytes);
        out
    }

    #[test]
    fn an_honest_run_and_forged_proposals_break_no_rule() {
        // Grants first, then to member 1: an empty proposal, one of
        // garbage, then time.
        let mut input = vec![3 << 3];
        for entries in [
            vec![],
            vec![raft::prelude::Entry {
                data: b"\xff\x00".to_vec(),
                ..Default::default()
            }],
        ] {
            let m = Message {
                msg_type: raft::prelude::MessageType::MsgPropose as i32,
                term: 5,
                entries,
                ..Message::default()
            };
            input.extend(frame(0, &m));
        }
        input.extend([239, 239, 240, 241]);
        assert_eq!(peer_frames(&input), Ok(()));
        let outcome = Trio::run(&input).expect("no rule broken");
        assert!(
            outcome
                .events
                .iter()
                .any(|(_, e)| matches!(e, ReplicaEvent::Leading { .. })),
            "a member led: {outcome:?}"
        );
        assert!(!outcome.sent.is_empty(), "clients were answered");
    }

    /// Seeds for the fuzzer (`cargo test --features raft,fuzzing --lib
    /// peer_frames::tests::seeds -- --ignored`, with `TICKETING_SEED_DIR`
    /// set to where they go): the messages members send each other in an
    /// honest run, replayed as frames, late and to every member, between
    /// waits and client requests.
    #[test]
    #[ignore]
    fn seeds() {
        let dir = std::env::var("TICKETING_SEED_DIR").expect("TICKETING_SEED_DIR");
        let mut trio = Trio::new(4, true);
        let mut sent = Vec::new();
        trio.advance(Duration::from_secs(1)).unwrap();
        for key in 0..6 {
            trio.client(key).unwrap();
            for _ in 0..5 {
                trio.now = trio.now.saturating_add(STEP);
                let now = trio.now;
                for id in core::mem::take(&mut trio.syncing) {
                    trio.replicas.get_mut(&id).unwrap().handle_persisted(now);
                }
                for r in trio.replicas.values_mut() {
                    r.handle_timeout(now);
                }
                for id in 1..=MEMBERS {
                    while let Some(out) = trio.replicas.get_mut(&id).unwrap().poll_output() {
                        if let Output::Send(m) = &out {
                            sent.push(m.clone());
                        }
                        if let Output::Persist(p) = &out {
                            trio.disks.get_mut(&id).unwrap().persist(p);
                            trio.syncing.push(id);
                        }
                    }
                }
            }
        }
        let small: Vec<&Message> = sent.iter().filter(|m| m.encoded_len() < 256).collect();
        assert!(small.len() > 20, "{} messages", small.len());
        for (n, chunk) in small.chunks(4).enumerate() {
            let mut input = vec![u8::try_from(n % 64).unwrap()];
            for (i, m) in chunk.iter().enumerate() {
                // To each member in turn, from a member of its own link.
                input.extend(frame(u8::try_from((n + i) % 6).unwrap(), m));
                input.push(200 + u8::try_from(i).unwrap());
            }
            input.push(240 + u8::try_from(n % 4).unwrap());
            let name = format!("{dir}/seed-{n:03}");
            std::fs::write(&name, &input).unwrap();
            assert_eq!(peer_frames(&input), Ok(()), "{name}");
        }
    }

    #[test]
    fn a_check_that_fails_is_said_with_its_step() {
        let trio = Trio {
            events: vec![(2, ReplicaEvent::Failed { peer: 3 })],
            ..Trio::new(10_000, false)
        };
        assert_eq!(
            trio.check(),
            Err("member 2's engine failed on a message from member 3".to_string())
        );
    }
}
