//! What a peer may send (PROTOCOL.md 4.3, "Peers are authenticated,
//! always"): the one place that decides whether a peer's message is
//! stepped into raft-rs. An authenticated peer is still held to what
//! members exchange: votes, appends, heartbeats, snapshots, their answers
//! and a leadership transfer's timeout-now. Anything else, and any of
//! those that raft-rs would panic on or fail on, is refused: the member
//! drops it and counts it ([`ReplicaStats`](super::ReplicaStats)), and
//! raft-rs never sees it.
//!
//! Peers are crash-fault members: a lie inside a well-formed message (an
//! append of forged entries that are consistent, a vote granted twice) is
//! beyond any screen. What is screened is every field that can make
//! raft-rs 0.7 assert, unwrap, index out of bounds, overflow or `fatal!`
//! (which panics), now or in a later tick or `Ready`, given this member's
//! state; a refusal names the raft-rs function it protects. An honest
//! member's message, however late, duplicated or reordered, is never
//! refused, each check holding for everything raft-rs itself sends, but
//! for one that raft-rs could not take either: a timeout-now that comes
//! late, while a snapshot is being made durable (members of this crate
//! never transfer leadership yet).
//!
//! | message | what raft-rs would do with a bad one | refusal |
//! |---|---|---|
//! | a type prost kept as a number | `get_msg_type` unwraps `MessageType::from_i32` (`RawNode::step`) | [`Refusal::UnknownType`] |
//! | `MsgPropose`, `MsgTransferLeader`, `MsgHup`, `MsgBeat`, `MsgUnreachable`, `MsgSnapStatus`, `MsgCheckQuorum`, `MsgReadIndex(Resp)` | take a proposal, start a transfer, ...; an empty `MsgPropose` `fatal!`s (`step_leader`), a `MsgReadIndex` without entries indexes `entries[0]` | [`Refusal::NotFromAPeer`] |
//! | `to` not this member, `from` this member or 0 | answer itself | [`Refusal::Misaddressed`] |
//! | term 0 | take it for a local message, skipping every term check: a vote at term 0 is answered at term 0, which `RaftCore::send` `fatal!`s on | [`Refusal::NoTerm`] |
//! | a term or index past 2^62 | adopt a term whose next election overflows `term + 1` (`become_candidate`, `campaign`); `match_hint + 1` (`Progress::maybe_decr_to`), `index + 1` (`Unstable::restore`) | [`Refusal::OutOfRange`] |
//! | an entry type prost kept as a number | store it, then unwrap `EntryType::from_i32` when campaigning (`hup`, `maybe_commit_by_vote`: `num_pending_conf`) | [`Refusal::UnknownEntryType`] |
//! | entries that do not follow the append's index one by one | subtract past 0 or slice past the end (`RaftLog::maybe_append`), `fatal!` on a gap (`Unstable::truncate_and_append`) or on a commit past the log (`RaftLog::commit_to`) | [`Refusal::EntriesNotContiguous`] |
//! | an entry of term 0, terms going down or past the message's | a term-0 entry past the log passes for one held (`RaftLog::term` answers 0 there), the next makes a gap: `fatal!` in `Unstable::truncate_and_append` | [`Refusal::EntryTermsOutOfOrder`] |
//! | an append anchored past the log with log term 0 | take the anchor as matching (`RaftLog::term` answers 0 past the end): `fatal!` in `RaftLog::commit_to`, or acknowledge entries it does not hold | [`Refusal::AnchorPastLog`] |
//! | a heartbeat's commit past the log | `fatal!` in `RaftLog::commit_to` (`handle_heartbeat`) | none: clamped ([`admit`]) |
//! | a snapshot without metadata or at index 0 | restore nothing (raft-rs's leader `fatal!`s before sending one: `prepare_send_snapshot`) | [`Refusal::EmptySnapshot`] |
//! | a snapshot of term 0 or past the message's | a term-0 snapshot past the log passes for held: `fatal!` in `RaftLog::commit_to` (`Raft::restore`) | [`Refusal::SnapshotTerm`] |
//! | a configuration raft-rs cannot restore as given | `fatal!` in `Raft::restore` (`confchange::restore` fails, or gives back another configuration) | [`Refusal::SnapshotConfState`] |
//! | a snapshot whose data is not a table image | (the replica) stop serving without reaching the snapshot's index, so that raft-rs's applied index never does: `fatal!` in `hup` at the next election | [`Refusal::SnapshotNotATable`] ([`readable`]) |
//! | an entry that is neither decisions nor a configuration change | (the replica) stop serving for good once it is committed and applied, every member alike | [`Refusal::UnreadableEntry`] ([`readable`]) |
//! | an entry or snapshot holding another cluster's identity | (the replica) stop serving, its directory being another cluster's | [`Refusal::OtherCluster`] ([`readable`]) |
//! | a snapshot at the commit index that contradicts the committed entry | replace a committed entry; with the log then as durable as it is long, a won election trips `RawNode::ready`'s assert | [`Refusal::SnapshotContradictsCommit`] |
//! | a leader's acknowledgement past its own log | count the follower for entries it never had (`Progress::maybe_update`): commits without a majority | [`Refusal::AckPastLog`] |
//! | a pre-vote this member refuses while its term is 0 | answer at term 0: `fatal!` in `RaftCore::send` | [`Refusal::PreVoteRefusedAtTermZero`] |
//! | a vote granted before the candidate's log is durable | `assert_eq!(last_index, persisted)` in `become_leader`, then `RawNode::ready`'s | [`Refusal::VoteBeforeDurable`] |
//! | a timeout-now while a snapshot is being made durable | campaign, reading entries the snapshot replaced: `fatal!` in `hup` | [`Refusal::TimeoutNowDuringSnapshot`] |
//!
//! What needs no check: a heartbeat answer's commit (raft-rs only records
//! it), an append's commit past what it carries (`maybe_append` commits no
//! further than its last entry: an honest leader sends its own commit
//! with a batch cut short by size), a rejection's hint past the leader's
//! log (`find_conflict_by_term` returns it as is), a snapshot that does
//! not name this member (`Raft::restore` ignores it), messages raft-rs
//! ignores in this member's role or term.

use std::collections::BTreeSet;

use raft::prelude::{ConfState, EntryType, Message, MessageType};
use raft::{Raft, StateRole};
use thiserror::Error;

use super::snapshot::SnapshotData;
use super::store::LogStore;
use super::ClusterId;
use crate::server::Decision;

/// Past any term or index a cluster reaches (a million entries a second
/// for 146,000 years), and far enough below `u64::MAX` that raft-rs's
/// `+ 1`s (`term + 1`, `index + 1`, `last_index + 1`) never overflow.
const CEILING: u64 = 1 << 62;

/// Why a member refused a peer's message (PROTOCOL.md 4.3, "Peers are
/// authenticated, always"): it is not from a member, or not what members
/// send, or raft-rs would fail on it (panic, then or later) in the state
/// the member is in. It was dropped, and counted
/// ([`ReplicaStats`](super::ReplicaStats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Its sender is not a member.
    #[error("its sender is not a member")]
    NotAMember,
    /// Its type is not one raft-rs knows (prost keeps the number).
    #[error("unknown message type {0}")]
    UnknownType(i32),
    /// A type that only a member's own core steps: a proposal, a
    /// leadership transfer, raft-rs's local messages, read index.
    #[error("{0:?} is never taken from a peer")]
    NotFromAPeer(MessageType),
    /// It is not for this member, or it claims to come from this member
    /// or from nobody (0).
    #[error("misaddressed")]
    Misaddressed,
    /// Term 0, which raft-rs takes for a local message: every message a
    /// member sends has a term.
    #[error("no term")]
    NoTerm,
    /// A term or index past 2^62.
    #[error("a term or index out of range")]
    OutOfRange,
    /// An append carries an entry of a type raft-rs does not know.
    #[error("unknown entry type {0}")]
    UnknownEntryType(i32),
    /// An append whose entries do not follow its index one by one.
    #[error("entries not contiguous")]
    EntriesNotContiguous,
    /// An append with an entry of term 0, or whose terms go down (from
    /// its log term on) or pass the message's term.
    #[error("entry terms out of order")]
    EntryTermsOutOfOrder,
    /// An append anchored past this member's log with log term 0.
    #[error("an append anchored past the log with log term 0")]
    AnchorPastLog,
    /// A snapshot without metadata, or at index 0.
    #[error("an empty snapshot")]
    EmptySnapshot,
    /// A snapshot of term 0, or of a term past the message's.
    #[error("a snapshot's term out of range")]
    SnapshotTerm,
    /// A snapshot whose configuration raft-rs cannot restore as given.
    #[error("a snapshot's configuration that cannot be restored")]
    SnapshotConfState,
    /// A snapshot whose data is not a member's snapshot of its table.
    #[error("a snapshot that is not a table")]
    SnapshotNotATable,
    /// An append with an entry this member could not apply: a normal
    /// entry that is not one of decisions, a configuration change that
    /// does not decode.
    #[error("an entry that cannot be read")]
    UnreadableEntry,
    /// An entry or a snapshot of another cluster than the one this member
    /// recorded: this member stops (`ReplicaEvent::OtherCluster`).
    #[error("cluster {0}'s entry or snapshot")]
    OtherCluster(ClusterId),
    /// A snapshot at this member's commit index whose term is not the
    /// committed entry's.
    #[error("a snapshot that contradicts the committed log")]
    SnapshotContradictsCommit,
    /// An acknowledgement, to this leader in its term, of entries past its
    /// log.
    #[error("an acknowledgement past the leader's log")]
    AckPastLog,
    /// A pre-vote that this member, at term 0, would refuse.
    #[error("a pre-vote refused at term 0")]
    PreVoteRefusedAtTermZero,
    /// A vote granted to this candidate before its log is durable: no
    /// answer to its request can come before.
    #[error("a vote granted before the candidate's log is durable")]
    VoteBeforeDurable,
    /// A timeout-now that would have this member campaign while a
    /// snapshot it installs is being made durable.
    #[error("a timeout-now while a snapshot is being made durable")]
    TimeoutNowDuringSnapshot,
}

/// The message to step for a peer's `msg`, or why it is refused: its
/// [`screen`], and a heartbeat's commit clamped to this member's log.
///
/// A leader's heartbeat carries its commit index clamped to what the
/// follower acknowledged (`send_heartbeat`): past the log of a follower
/// that lost entries it had acknowledged (its disk), until the leader
/// hears from it again. Refused, it would leave the follower to stand for
/// election; stepped as it is, raft-rs would `fatal!`
/// (`RaftLog::commit_to`). Clamped, it commits what this member holds, and
/// the leader's next append brings the rest. An append needs no clamp:
/// raft-rs commits no further than its last entry.
///
/// And what it carries must be what this member can apply ([`readable`]).
pub(super) fn admit(
    mut msg: Message,
    raft: &Raft<LogStore>,
    cluster: Option<ClusterId>,
) -> Result<Message, Refusal> {
    screen(&msg, raft)?;
    readable(&msg, cluster)?;
    if msg.msg_type == MessageType::MsgHeartbeat as i32 {
        msg.commit = msg.commit.min(raft.raft_log.last_index());
    }
    Ok(msg)
}

/// Whether `msg`, from a member, may be stepped into `raft` as it stands
/// (a heartbeat's commit aside: [`admit`]).
pub(super) fn screen(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    let kind = MessageType::from_i32(msg.msg_type).ok_or(Refusal::UnknownType(msg.msg_type))?;
    if !from_a_peer(kind) {
        return Err(Refusal::NotFromAPeer(kind));
    }
    if msg.to != raft.id || msg.from == raft.id || msg.from == raft::INVALID_ID {
        return Err(Refusal::Misaddressed);
    }
    if msg.term == 0 {
        // Raft::step: "local message", no term handled. Every message a
        // member sends has its term (RaftCore::send), never 0.
        return Err(Refusal::NoTerm);
    }
    if !in_range(msg) {
        return Err(Refusal::OutOfRange);
    }
    match kind {
        MessageType::MsgAppend => append(msg, raft),
        MessageType::MsgSnapshot => snapshot(msg, raft),
        MessageType::MsgAppendResponse => append_response(msg, raft),
        MessageType::MsgRequestPreVote => pre_vote(msg, raft),
        MessageType::MsgRequestVoteResponse => vote_response(msg, raft),
        MessageType::MsgTimeoutNow => timeout_now(msg, raft),
        _ => Ok(()),
    }
}

/// The types members exchange. `MsgRequestVote`, `MsgRequestPreVoteResponse`,
/// `MsgHeartbeat` (its commit clamped) and `MsgHeartbeatResponse` need no
/// more than the checks common to all.
fn from_a_peer(kind: MessageType) -> bool {
    matches!(
        kind,
        MessageType::MsgRequestVote
            | MessageType::MsgRequestVoteResponse
            | MessageType::MsgRequestPreVote
            | MessageType::MsgRequestPreVoteResponse
            | MessageType::MsgAppend
            | MessageType::MsgAppendResponse
            | MessageType::MsgHeartbeat
            | MessageType::MsgHeartbeatResponse
            | MessageType::MsgSnapshot
            | MessageType::MsgTimeoutNow
    )
}

/// Every term and index in `msg` is below [`CEILING`].
fn in_range(msg: &Message) -> bool {
    let fields = [
        msg.term,
        msg.log_term,
        msg.index,
        msg.commit,
        msg.commit_term,
        msg.reject_hint,
        msg.request_snapshot,
    ];
    let entries = msg.entries.iter().flat_map(|e| [e.index, e.term]);
    let snapshot = msg
        .snapshot
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| [m.index, m.term])
        .into_iter()
        .flatten();
    fields
        .into_iter()
        .chain(entries)
        .chain(snapshot)
        .all(|n| n < CEILING)
}

/// An append (raft.rs `handle_append_entries`, raft_log.rs `maybe_append`).
fn append(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    if let Some(e) = msg
        .entries
        .iter()
        .find(|e| EntryType::from_i32(e.entry_type).is_none())
    {
        // Kept in the log, then unwrapped by `num_pending_conf` when this
        // member campaigns (`hup`) or commits by vote as a candidate.
        return Err(Refusal::UnknownEntryType(e.entry_type));
    }
    // `maybe_append` slices from `conflict - (index + 1)` and commits to
    // `index + len`: both assume the entries are index + 1, index + 2, ...
    // (no overflow: every index is below CEILING).
    if (msg.index + 1..)
        .zip(&msg.entries)
        .any(|(at, e)| e.index != at)
    {
        return Err(Refusal::EntriesNotContiguous);
    }
    // A log's terms never go down, and a leader's entries are of its term
    // or earlier. A term-0 entry is the one that matters to raft-rs: past
    // the log, `RaftLog::term` answers 0, so `find_conflict` takes it for
    // an entry held and the next one leaves a gap, which
    // `Unstable::truncate_and_append` `fatal!`s on.
    let mut floor = msg.log_term.max(1);
    for e in &msg.entries {
        if e.term < floor || e.term > msg.term {
            return Err(Refusal::EntryTermsOutOfOrder);
        }
        floor = e.term;
    }
    // Past the log `RaftLog::term` answers 0, so an anchor there of log
    // term 0 matches: `maybe_append` then commits to `index + len` past
    // the log (`commit_to` `fatal!`s) or acknowledges what it never got.
    // A leader sends log term 0 only with index 0 (the log's start).
    if msg.log_term == 0 && msg.index > raft.raft_log.last_index() {
        return Err(Refusal::AnchorPastLog);
    }
    Ok(())
}

/// A snapshot (raft.rs `handle_snapshot`, `restore`).
fn snapshot(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    let meta = match &msg.snapshot {
        Some(s) => match &s.metadata {
            Some(meta) if meta.index > 0 => meta,
            _ => return Err(Refusal::EmptySnapshot),
        },
        None => return Err(Refusal::EmptySnapshot),
    };
    // `restore` fast-forwards the commit to a snapshot it takes for one
    // of its entries: past the log, a term-0 one (`RaftLog::term` answers
    // 0 there), and `commit_to` `fatal!`s. A snapshot's term is a
    // committed entry's, at most the leader's.
    if meta.term == 0 || meta.term > msg.term {
        return Err(Refusal::SnapshotTerm);
    }
    if !restorable(meta.conf_state.as_ref().unwrap_or(&ConfState::default())) {
        return Err(Refusal::SnapshotConfState);
    }
    // At the commit index, `restore` installs a snapshot whose term is not
    // the committed entry's (below, it ignores it): the log would end
    // where it is durable with the snapshot's write outstanding, which
    // VoteBeforeDurable's check relies on never being so.
    let log = &raft.raft_log;
    if meta.index == log.committed && log.term(meta.index) != Ok(meta.term) {
        return Err(Refusal::SnapshotContradictsCommit);
    }
    Ok(())
}

/// Whether this member can apply what `msg` carries, once committed: each
/// entry of an append (decisions, or a configuration change) and a
/// snapshot's table, of this member's cluster (`cluster`, once known).
///
/// One it could not read would stop it serving when applied
/// (`Replica::catch_up`, `Replica::install`): an entry of garbage,
/// committed, would stop every member for good, restarts included. A
/// snapshot it cannot read leaves its applied index (raft-rs's too) short
/// of the snapshot, past which its log starts: `hup` `fatal!`s at its next
/// election, reading entries the snapshot replaced. Members send neither.
pub(super) fn readable(msg: &Message, cluster: Option<ClusterId>) -> Result<(), Refusal> {
    let ours = |theirs: Option<ClusterId>| match (cluster, theirs) {
        (Some(ours), Some(theirs)) if ours != theirs => Err(Refusal::OtherCluster(theirs)),
        _ => Ok(()),
    };
    for e in &msg.entries {
        if e.data.is_empty() {
            continue;
        }
        match EntryType::from_i32(e.entry_type) {
            Some(EntryType::EntryNormal) => {
                let id = Decision::check_entry(&e.data).map_err(|_| Refusal::UnreadableEntry)?;
                ours(id.and_then(|id| ClusterId::new(id.get())))?;
            }
            Some(EntryType::EntryConfChange) => {
                <raft::prelude::ConfChange as prost::Message>::decode(e.data.as_slice())
                    .map_err(|_| Refusal::UnreadableEntry)?;
            }
            Some(EntryType::EntryConfChangeV2) => {
                <raft::prelude::ConfChangeV2 as prost::Message>::decode(e.data.as_slice())
                    .map_err(|_| Refusal::UnreadableEntry)?;
            }
            // Refused by the screen.
            None => return Err(Refusal::UnknownEntryType(e.entry_type)),
        }
    }
    if let Some(s) = &msg.snapshot {
        let data = SnapshotData::decode(&s.data).ok_or(Refusal::SnapshotNotATable)?;
        ours(data.cluster)?;
    }
    Ok(())
}

/// Whether raft-rs restores `cs` as given: `Raft::restore` applies it
/// with `confchange::restore` (the outgoing voters as simple changes one
/// by one, then the rest entering a joint configuration, or, not joint,
/// voters then learners one by one), and `fatal!`s if that fails or gives
/// back another configuration (`conf_state_eq`, which ignores order and
/// repeats). Member ids are never 0 (a change of node 0 is skipped), a
/// configuration has voters, a learner is no voter (added after the
/// voters, it would demote one), and only a joint configuration has
/// learners to come (which are outgoing voters staying as learners) or
/// leaves it by itself (`auto_leave`). Checked against raft-rs's own
/// restore in the tests.
fn restorable(cs: &ConfState) -> bool {
    let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<u64>>();
    let voters = set(&cs.voters);
    let outgoing = set(&cs.voters_outgoing);
    let learners = set(&cs.learners);
    let next = set(&cs.learners_next);
    if voters.is_empty()
        || [&voters, &outgoing, &learners, &next]
            .iter()
            .any(|s| s.contains(&0))
    {
        return false;
    }
    if !learners.is_disjoint(&voters) || !learners.is_disjoint(&outgoing) {
        return false;
    }
    if outgoing.is_empty() {
        next.is_empty() && !cs.auto_leave
    } else {
        next.is_subset(&outgoing) && next.is_disjoint(&voters)
    }
}

/// An answer to an append, at a leader (raft.rs `handle_append_response`).
fn append_response(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    // `Progress::maybe_update` takes any index: one past this leader's log
    // (it only grows in its term, and a follower acknowledges what it was
    // sent) would count the follower for entries it never had, and stop
    // sending to it. Rejections are checked against the progress itself
    // (`maybe_decr_to`), and other roles and terms ignore the answer.
    if !msg.reject
        && raft.state == StateRole::Leader
        && msg.term == raft.term
        && msg.index > raft.raft_log.last_index()
    {
        return Err(Refusal::AckPastLog);
    }
    Ok(())
}

/// A pre-vote (raft.rs `Raft::step`, vote requests).
fn pre_vote(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    // A refusal is answered with this member's term, and RaftCore::send
    // `fatal!`s on a vote answer of term 0. Only a pre-vote meets a member
    // at term 0 (a vote's term, never 0, becomes the member's first), and
    // there, with no leader known, every condition but the candidate's log
    // and priority holds. An honest candidate's pre-vote is granted: every
    // member runs priority 0, and a member at term 0 has no log.
    if raft.term != 0 {
        return Ok(());
    }
    let log = &raft.raft_log;
    let priority = match msg.priority {
        0 => i64::try_from(msg.deprecated_priority).unwrap_or(i64::MAX),
        p => p,
    };
    let granted = log.is_up_to_date(msg.index, msg.log_term)
        && (msg.index > log.last_index() || raft.priority <= priority);
    if granted {
        Ok(())
    } else {
        Err(Refusal::PreVoteRefusedAtTermZero)
    }
}

/// A vote, at a candidate (raft.rs `step_candidate`, `poll`, `become_leader`).
fn vote_response(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    // A candidate sends its requests once its log is durable (they are a
    // Ready's persisted messages), and its log does not change until it
    // leaves the term: a vote granted in its term while the log is not
    // all durable answers no request. Counted, it may win the election,
    // and `become_leader` asserts that the log is all durable (then
    // `RawNode::ready`, that no write is outstanding: a log that ends
    // past where it is durable is the sign of one, which
    // SnapshotContradictsCommit keeps true).
    let log = &raft.raft_log;
    if !msg.reject
        && raft.state == StateRole::Candidate
        && msg.term == raft.term
        && log.persisted != log.last_index()
    {
        return Err(Refusal::VoteBeforeDurable);
    }
    Ok(())
}

/// A leadership transfer's timeout-now (raft.rs `step_follower`, `hup`).
fn timeout_now(msg: &Message, raft: &Raft<LogStore>) -> Result<(), Refusal> {
    // `hup` reads the entries from the one after the applied index up to
    // the commit (it waits for configuration changes among them) and
    // `fatal!`s if they are gone. They are while a leader's snapshot is
    // being made durable: the log starts after it, and the applied index
    // reaches it only once it is durable (`RaftLog::applied_to`). A leader
    // sends timeout-now once the follower acknowledged its whole log,
    // which a follower does once that is durable, so only a late one can
    // come meanwhile; refused, the transfer times out at the leader.
    let campaigns =
        msg.term > raft.term || (msg.term == raft.term && raft.state == StateRole::Follower);
    let log = &raft.raft_log;
    let from = log.unstable.maybe_first_index().unwrap_or(log.applied + 1);
    if campaigns && raft.promotable() && from < log.first_index() {
        return Err(Refusal::TimeoutNowDuringSnapshot);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! For each refusal, the state in which raft-rs panics (or misbehaves)
    //! on the message, shown on a `RawNode` as the replica configures it,
    //! and the screen refusing it; what an honest member sends in that
    //! state passes. Honest traffic under elections, crashes, catch-up and
    //! repeats is `tests.rs`'s, whose cluster refuses nothing; below, a
    //! property steps forged messages into that cluster.

    use core::time::Duration;
    use std::cell::Cell;
    use std::panic::{self, AssertUnwindSafe};
    use std::sync::Once;

    use quickcheck::{Arbitrary, Gen, TestResult};

    use crate::seeded::qc;
    use raft::prelude::{Entry, HardState, Snapshot, SnapshotMetadata};
    use raft::{RawNode, Ready};

    use super::super::tests::{Cluster, STEP};
    use super::super::{Decision, MemoryDisk, Restored};
    use super::*;
    use crate::server::TableImage;

    thread_local! {
        /// This thread expects a panic: the hook prints nothing for it.
        static QUIET: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether `f` panics, without a word on the test's output (other
    /// threads' panics print as usual).
    fn panics(f: impl FnOnce()) -> bool {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let print = panic::take_hook();
            panic::set_hook(Box::new(move |info| {
                if !QUIET.with(Cell::get) {
                    print(info);
                }
            }));
        });
        QUIET.with(|q| q.set(true));
        let panicked = panic::catch_unwind(AssertUnwindSafe(f)).is_err();
        QUIET.with(|q| q.set(false));
        panicked
    }

    fn voters(ids: &[u64]) -> ConfState {
        ConfState {
            voters: ids.to_vec(),
            ..ConfState::default()
        }
    }

    /// Member `id` of 1, 2 and 3, started from `hs` and `entries`, with
    /// the raft-rs configuration a replica gives it.
    fn member(id: u64, hs: HardState, entries: Vec<Entry>) -> RawNode<LogStore> {
        let store = LogStore::restored(hs, voters(&[1, 2, 3]), None, entries);
        // A member's engine, as the replica configures it.
        let ticks = (
            super::super::ELECTION_TICKS,
            2 * super::super::ELECTION_TICKS,
        );
        let config = super::super::engine_config(id, ticks, 0);
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        RawNode::new(&config, store, &logger).expect("a valid member")
    }

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Entry::default()
        }
    }

    /// Member 1 of a cluster that never ran: term 0, no log.
    fn fresh() -> RawNode<LogStore> {
        member(1, HardState::default(), Vec::new())
    }

    /// Member 1, following in term 1 (no leader heard of since its
    /// start): entries 1 to 3 of term 1, 2 of them committed.
    fn follower() -> RawNode<LogStore> {
        let hs = HardState {
            term: 1,
            vote: 2,
            commit: 2,
        };
        member(1, hs, (1..=3).map(|i| entry(i, 1)).collect())
    }

    /// Member 1, leading in term 2 over `follower`'s log: its term's
    /// empty entry (4) durable, sent to the others, not acknowledged.
    fn leader() -> RawNode<LogStore> {
        let mut n = follower();
        n.raft.become_candidate();
        n.raft.become_leader();
        durable(&mut n);
        n
    }

    fn msg(kind: MessageType, from: u64, term: u64) -> Message {
        Message {
            msg_type: kind as i32,
            from,
            to: 1,
            term,
            ..Message::default()
        }
    }

    fn append(term: u64, index: u64, log_term: u64, entries: Vec<Entry>) -> Message {
        Message {
            index,
            log_term,
            entries,
            ..msg(MessageType::MsgAppend, 2, term)
        }
    }

    /// An empty table's image, as a leader's snapshot carries it.
    fn table() -> Vec<u8> {
        TableImage {
            epoch: 1,
            count: 0,
            max_lease_ms: 0,
            grace_ms: 0,
            written_at: Duration::ZERO,
            grants: Vec::new(),
        }
        .encode()
    }

    fn snapshot(term: u64, index: u64, snap_term: u64, cs: ConfState) -> Message {
        Message {
            snapshot: Some(Snapshot {
                data: table(),
                metadata: Some(SnapshotMetadata {
                    conf_state: Some(cs),
                    index,
                    term: snap_term,
                }),
            }),
            ..msg(MessageType::MsgSnapshot, 2, term)
        }
    }

    /// Writes a Ready to the store, as the replica does before its disk
    /// syncs.
    fn write(n: &mut RawNode<LogStore>, rd: &Ready) {
        if !rd.snapshot().is_empty() {
            n.mut_store().install(rd.snapshot().clone());
        }
        n.mut_store().append(rd.entries());
        if let Some(hs) = rd.hs() {
            n.mut_store().set_hard_state(hs.clone());
        }
    }

    /// Hands out every Ready and makes it durable at once; what it sent.
    fn durable(n: &mut RawNode<LogStore>) -> Vec<Message> {
        let mut sent = Vec::new();
        while n.has_ready() {
            let mut rd = n.ready();
            sent.extend(rd.take_messages());
            write(n, &rd);
            sent.extend(rd.take_persisted_messages());
            let mut light = n.advance_append(rd);
            sent.extend(light.take_messages());
        }
        sent
    }

    /// Hands out a Ready whose write is then under way: its number.
    fn under_way(n: &mut RawNode<LogStore>) -> u64 {
        let rd = n.ready();
        write(n, &rd);
        let number = rd.number();
        n.advance_append_async(rd);
        number
    }

    /// Whether raft-rs panics stepping `m` into `n`.
    fn step_panics(mut n: RawNode<LogStore>, m: &Message) -> bool {
        panics(|| {
            let _ = n.step(m.clone());
        })
    }

    #[test]
    fn an_unknown_message_type_is_refused() {
        let m = Message {
            msg_type: 99,
            ..msg(MessageType::MsgHeartbeat, 2, 1)
        };
        assert!(
            step_panics(follower(), &m),
            "RawNode::step: from_i32 unwrapped"
        );
        assert_eq!(screen(&m, &follower().raft), Err(Refusal::UnknownType(99)));
    }

    #[test]
    fn what_only_a_members_own_core_steps_is_never_taken_from_a_peer() {
        use MessageType::*;
        // An empty proposal: "stepped empty MsgProp".
        assert!(step_panics(leader(), &msg(MsgPropose, 2, 2)));
        // A read index without its context, once the leader committed an
        // entry of its term: `entries[0]`.
        let mut n = leader();
        let ack = Message {
            index: 4,
            ..msg(MsgAppendResponse, 2, 2)
        };
        n.step(ack).unwrap();
        assert_eq!(n.raft.raft_log.committed, 4);
        assert!(step_panics(n, &msg(MsgReadIndex, 2, 2)));
        // A proposal with an entry: the peer's entry in the leader's log.
        let mut n = leader();
        let proposal = Message {
            entries: vec![Entry::default()],
            ..msg(MsgPropose, 2, 2)
        };
        n.step(proposal).unwrap();
        assert_eq!(n.raft.raft_log.last_index(), 5);
        // A transfer: the leader hands its leadership to the peer.
        let mut n = leader();
        n.step(msg(MsgTransferLeader, 2, 2)).unwrap();
        assert_eq!(n.raft.lead_transferee, Some(2));

        let n = leader();
        for kind in [
            MsgHup,
            MsgBeat,
            MsgPropose,
            MsgUnreachable,
            MsgSnapStatus,
            MsgCheckQuorum,
            MsgTransferLeader,
            MsgReadIndex,
            MsgReadIndexResp,
        ] {
            let refused = screen(&msg(kind, 2, 2), &n.raft);
            assert_eq!(refused, Err(Refusal::NotFromAPeer(kind)));
        }
        for kind in [
            MsgRequestVote,
            MsgRequestVoteResponse,
            MsgRequestPreVote,
            MsgRequestPreVoteResponse,
            MsgAppendResponse,
            MsgHeartbeat,
            MsgHeartbeatResponse,
            MsgTimeoutNow,
        ] {
            assert_eq!(screen(&msg(kind, 2, 2), &n.raft), Ok(()), "{kind:?}");
        }
    }

    #[test]
    fn a_message_not_from_a_peer_to_this_member_is_refused() {
        let n = follower();
        let heartbeat = msg(MessageType::MsgHeartbeat, 2, 1);
        assert_eq!(screen(&heartbeat, &n.raft), Ok(()));
        for (from, to) in [(2, 3), (1, 1), (0, 1), (2, 0)] {
            let m = Message {
                from,
                to,
                ..heartbeat.clone()
            };
            assert_eq!(screen(&m, &n.raft), Err(Refusal::Misaddressed));
        }
    }

    #[test]
    fn a_message_without_a_term_is_refused() {
        // Taken for a local message: a pre-vote at term 0 is granted at
        // term 0, and RaftCore::send `fatal!`s on the answer.
        let pre_vote = msg(MessageType::MsgRequestPreVote, 2, 0);
        assert!(step_panics(fresh(), &pre_vote));
        assert_eq!(screen(&pre_vote, &fresh().raft), Err(Refusal::NoTerm));
    }

    #[test]
    fn a_term_or_index_out_of_range_is_refused() {
        // The last term: taken, and the member's next election overflows
        // `term + 1` (a wrap to 0 in a release build, which `send` then
        // `fatal!`s on).
        let heartbeat = msg(MessageType::MsgHeartbeat, 2, u64::MAX);
        let mut n = follower();
        n.step(heartbeat.clone()).unwrap();
        assert_eq!(n.raft.term, u64::MAX);
        assert!(panics(|| {
            let _ = n.campaign();
        }));
        // A rejection's hint at the largest index: `match_hint + 1` in
        // Progress::maybe_decr_to (the leader probes member 2 at index 3).
        let reject = Message {
            reject: true,
            index: 3,
            reject_hint: u64::MAX,
            ..msg(MessageType::MsgAppendResponse, 2, 2)
        };
        assert!(step_panics(leader(), &reject));

        assert_eq!(
            screen(&heartbeat, &follower().raft),
            Err(Refusal::OutOfRange)
        );
        assert_eq!(screen(&reject, &leader().raft), Err(Refusal::OutOfRange));
        let below = Message {
            reject_hint: CEILING - 1,
            ..reject.clone()
        };
        assert_eq!(screen(&below, &leader().raft), Ok(()));
        assert!(!step_panics(leader(), &below));
    }

    #[test]
    fn an_entry_of_an_unknown_type_is_refused() {
        let mut m = append(1, 3, 1, vec![entry(4, 1)]);
        m.entries[0].entry_type = 7;
        m.commit = 4;
        // Kept and committed; read back when the member campaigns.
        let mut n = follower();
        n.step(m.clone()).unwrap();
        assert_eq!(n.raft.raft_log.committed, 4);
        assert!(panics(|| {
            let _ = n.campaign();
        }));
        assert_eq!(
            screen(&m, &follower().raft),
            Err(Refusal::UnknownEntryType(7))
        );
        // A configuration change is an entry members exchange.
        m.entries[0].entry_type = EntryType::EntryConfChangeV2 as i32;
        assert_eq!(screen(&m, &follower().raft), Ok(()));
    }

    #[test]
    fn entries_that_do_not_follow_the_index_one_by_one_are_refused() {
        // A gap: raft-rs appends nothing, then commits past its log.
        let mut gap = append(2, 3, 1, vec![entry(5, 1)]);
        gap.commit = 5;
        // Back over the anchor: `conflict - (index + 1)` goes below 0.
        let back = append(2, 3, 1, vec![entry(3, 2)]);
        for m in [gap, back] {
            assert!(step_panics(follower(), &m), "{m:?}");
            assert_eq!(
                screen(&m, &follower().raft),
                Err(Refusal::EntriesNotContiguous)
            );
        }
        let next = append(2, 3, 1, vec![entry(4, 1), entry(5, 2)]);
        assert_eq!(screen(&next, &follower().raft), Ok(()));
    }

    #[test]
    fn entry_terms_out_of_order_are_refused() {
        // A term-0 entry past the log passes for one held, and the next
        // one leaves a gap.
        let m = append(1, 3, 1, vec![entry(4, 0), entry(5, 1)]);
        assert!(step_panics(follower(), &m));
        assert_eq!(
            screen(&m, &follower().raft),
            Err(Refusal::EntryTermsOutOfOrder)
        );
        // Terms going down (from the log term on), or past the leader's:
        // no log has them.
        for (log_term, terms) in [(1, [2, 1]), (1, [1, 3]), (2, [1, 1])] {
            let m = append(2, 3, log_term, vec![entry(4, terms[0]), entry(5, terms[1])]);
            let refused = screen(&m, &follower().raft);
            assert_eq!(
                refused,
                Err(Refusal::EntryTermsOutOfOrder),
                "{log_term} {terms:?}"
            );
        }
        for terms in [[1, 1], [1, 2], [2, 2]] {
            let m = append(2, 3, 1, vec![entry(4, terms[0]), entry(5, terms[1])]);
            assert_eq!(screen(&m, &follower().raft), Ok(()));
        }
    }

    #[test]
    fn an_append_anchored_past_the_log_with_log_term_0_is_refused() {
        let mut m = append(1, 7, 0, Vec::new());
        m.commit = 7;
        assert!(step_panics(follower(), &m), "commit_to past the log");
        // Without a commit, raft-rs acknowledges entries it never got.
        m.commit = 0;
        let mut n = follower();
        n.step(m.clone()).unwrap();
        let answer = durable(&mut n)
            .into_iter()
            .find(|a| a.msg_type == MessageType::MsgAppendResponse as i32)
            .unwrap();
        assert_eq!(
            (answer.reject, answer.index, n.raft.raft_log.last_index()),
            (false, 7, 3)
        );
        assert_eq!(screen(&m, &follower().raft), Err(Refusal::AnchorPastLog));
        // With its term, a leader probing a member behind: refused by
        // raft-rs, which says where its log ends.
        m.log_term = 1;
        assert_eq!(screen(&m, &follower().raft), Ok(()));
        let mut n = follower();
        n.step(m).unwrap();
        let answer = durable(&mut n).pop().unwrap();
        assert_eq!((answer.reject, answer.reject_hint), (true, 3));
        // Log term 0 at the log's start.
        let m = append(1, 0, 0, vec![entry(1, 1)]);
        assert_eq!(screen(&m, &fresh().raft), Ok(()));
    }

    #[test]
    fn a_heartbeat_commit_past_the_log_is_clamped_not_refused() {
        let m = Message {
            commit: 9,
            ..msg(MessageType::MsgHeartbeat, 2, 1)
        };
        assert!(step_panics(follower(), &m), "commit_to past the log");
        let mut n = follower();
        let admitted = admit(m, &n.raft, None).unwrap();
        assert_eq!(admitted.commit, 3);
        n.step(admitted).unwrap();
        assert_eq!((n.raft.raft_log.committed, n.raft.leader_id), (3, 2));
        // Other messages go as they came.
        let m = Message {
            commit: 9,
            ..msg(MessageType::MsgHeartbeatResponse, 2, 1)
        };
        assert_eq!(admit(m.clone(), &follower().raft, None), Ok(m));
    }

    #[test]
    fn an_empty_snapshot_is_refused() {
        let n = follower();
        let none = msg(MessageType::MsgSnapshot, 2, 1);
        assert_eq!(screen(&none, &n.raft), Err(Refusal::EmptySnapshot));
        let zero = snapshot(1, 0, 1, voters(&[1, 2, 3]));
        assert_eq!(screen(&zero, &n.raft), Err(Refusal::EmptySnapshot));
        let one = snapshot(1, 9, 1, voters(&[1, 2, 3]));
        assert_eq!(screen(&one, &n.raft), Ok(()));
        assert!(!step_panics(follower(), &one));
    }

    #[test]
    fn a_snapshot_of_term_0_or_past_its_messages_term_is_refused() {
        // Of term 0 past the log: taken for an entry held, and the commit
        // fast-forwarded past the log.
        let zero = snapshot(1, 9, 0, voters(&[1, 2, 3]));
        assert!(step_panics(follower(), &zero));
        assert_eq!(screen(&zero, &follower().raft), Err(Refusal::SnapshotTerm));
        let later = snapshot(1, 9, 2, voters(&[1, 2, 3]));
        assert_eq!(screen(&later, &follower().raft), Err(Refusal::SnapshotTerm));
    }

    #[test]
    fn a_snapshot_whose_configuration_raft_rs_cannot_restore_is_refused() {
        let bad = [
            // A learner among the voters: restored, it is a learner only.
            ConfState {
                learners: vec![3],
                ..voters(&[1, 2, 3])
            },
            // No voters: confchange::restore fails.
            ConfState {
                learners: vec![1],
                ..ConfState::default()
            },
            // Member 0: skipped, so not restored.
            voters(&[1, 0]),
        ];
        for cs in bad {
            let m = snapshot(1, 9, 1, cs.clone());
            assert!(step_panics(follower(), &m), "{cs:?}");
            assert_eq!(
                screen(&m, &follower().raft),
                Err(Refusal::SnapshotConfState)
            );
        }
        // One that does not name this member: ignored by raft-rs.
        let m = snapshot(1, 9, 1, voters(&[2, 3]));
        assert_eq!(screen(&m, &follower().raft), Ok(()));
        let mut n = follower();
        n.step(m).unwrap();
        assert_eq!(n.raft.raft_log.last_index(), 3);
    }

    /// A configuration of ids 0 to 4 in every part.
    #[derive(Debug, Clone)]
    struct Conf(ConfState);

    impl Arbitrary for Conf {
        fn arbitrary(g: &mut Gen) -> Conf {
            let ids = |g: &mut Gen, often: bool| -> Vec<u64> {
                if !often && u8::arbitrary(g) % 3 > 0 {
                    return Vec::new();
                }
                let n = usize::arbitrary(g) % 4;
                (0..n).map(|_| u64::arbitrary(g) % 5).collect()
            };
            Conf(ConfState {
                voters: ids(g, true),
                learners: ids(g, true),
                voters_outgoing: ids(g, false),
                learners_next: ids(g, false),
                auto_leave: u8::arbitrary(g) % 4 == 0,
            })
        }
    }

    /// As raft-rs restores configurations where it starts (`Raft::new`:
    /// the same `confchange::restore` and comparison as `Raft::restore`).
    #[test]
    fn what_is_restorable_is_what_raft_rs_restores() {
        fn prop(Conf(cs): Conf) -> TestResult {
            // Nothing at all restores to nothing; raft-rs ignores such a
            // snapshot, which does not name the member.
            let parts = [
                &cs.voters,
                &cs.learners,
                &cs.voters_outgoing,
                &cs.learners_next,
            ];
            if parts.iter().all(|ids| ids.is_empty()) {
                return TestResult::discard();
            }
            let store = LogStore::restored(HardState::default(), cs.clone(), None, Vec::new());
            let logger = slog::Logger::root(slog::Discard, slog::o!());
            let mut made = false;
            let panicked =
                panics(|| made = RawNode::new(&raft::Config::new(1), store, &logger).is_ok());
            let (ours, theirs) = (restorable(&cs), made && !panicked);
            if ours == theirs {
                TestResult::passed()
            } else {
                TestResult::error(format!("{cs:?}: restorable {ours}, raft-rs {theirs}"))
            }
        }
        qc("restorable", CASES_RESTORABLE).quickcheck(prop as fn(Conf) -> TestResult);
    }

    #[test]
    fn a_snapshot_that_is_not_a_table_is_refused() {
        // Installed and made durable, but the replica cannot read it: its
        // applied index stays where it was (Replica::install stops it
        // instead), short of where the log now starts; the next election
        // reads entries the snapshot replaced.
        let mut m = snapshot(1, 9, 1, voters(&[1, 2, 3]));
        m.snapshot.as_mut().unwrap().data = b"not a table".to_vec();
        let mut n = follower();
        n.step(m.clone()).unwrap();
        let number = under_way(&mut n);
        n.on_persist_ready(number);
        assert!(panics(|| {
            let _ = n.campaign();
        }));
        assert_eq!(
            admit(m, &follower().raft, None),
            Err(Refusal::SnapshotNotATable)
        );
        let table = snapshot(1, 9, 1, voters(&[1, 2, 3]));
        assert_eq!(admit(table.clone(), &follower().raft, None), Ok(table));
    }

    /// An entry of garbage, committed, stopped every member for good
    /// (the audit's forged proposal: all three answered `E not_active`,
    /// restarts included). Nothing a member cannot apply is taken.
    #[test]
    fn an_append_of_entries_a_member_cannot_apply_is_refused() {
        let decisions = Decision::encode_entry(&[Decision::Floor { epoch: 7 }]);
        let cut = decisions[..decisions.len() - 1].to_vec();
        let conf = prost::Message::encode_to_vec(&raft::prelude::ConfChangeV2::default());
        let n = follower();
        let with = |data: Vec<u8>, entry_type: EntryType| {
            let entry = Entry {
                entry_type: entry_type as i32,
                data,
                ..entry(3, 1)
            };
            append(1, 2, 1, vec![entry])
        };
        for (data, kind) in [
            (b"\xff\x00garbage".to_vec(), EntryType::EntryNormal),
            (cut, EntryType::EntryNormal),
            (b"\xff\xff".to_vec(), EntryType::EntryConfChangeV2),
            (b"\xff\xff".to_vec(), EntryType::EntryConfChange),
        ] {
            let m = with(data, kind);
            assert_eq!(screen(&m, &n.raft), Ok(()), "raft-rs would take it");
            assert_eq!(
                admit(m, &n.raft, None),
                Err(Refusal::UnreadableEntry),
                "{kind:?}"
            );
        }
        for (data, kind) in [
            (decisions, EntryType::EntryNormal),
            (Vec::new(), EntryType::EntryNormal),
            (conf, EntryType::EntryConfChangeV2),
            (Vec::new(), EntryType::EntryConfChangeV2),
        ] {
            let m = with(data, kind);
            assert_eq!(admit(m.clone(), &n.raft, None), Ok(m), "{kind:?}");
        }
    }

    #[test]
    fn another_clusters_entry_or_snapshot_is_refused_once_the_identity_is_known() {
        let (ours, theirs) = (ClusterId::new(1).unwrap(), ClusterId::new(2).unwrap());
        let id = |c: ClusterId| core::num::NonZeroU128::new(c.get()).unwrap();
        let entry_of = |c: ClusterId| Entry {
            data: Decision::encode_entry(&[Decision::Cluster { id: id(c) }]),
            ..entry(3, 1)
        };
        let snapshot_of = |c: ClusterId| {
            let mut m = snapshot(1, 9, 1, voters(&[1, 2, 3]));
            m.snapshot.as_mut().unwrap().data = SnapshotData {
                cluster: Some(c),
                roster: Default::default(),
                image: TableImage::decode(&table()).unwrap(),
            }
            .encode();
            m
        };
        let n = follower();
        for m in [append(1, 2, 1, vec![entry_of(theirs)]), snapshot_of(theirs)] {
            assert_eq!(
                admit(m.clone(), &n.raft, Some(ours)),
                Err(Refusal::OtherCluster(theirs))
            );
            // Not known yet: it is the one this member will learn.
            assert_eq!(admit(m.clone(), &n.raft, None), Ok(m));
        }
        for m in [append(1, 2, 1, vec![entry_of(ours)]), snapshot_of(ours)] {
            assert_eq!(admit(m.clone(), &n.raft, Some(ours)), Ok(m));
        }
    }

    #[test]
    fn a_snapshot_that_contradicts_the_committed_log_is_refused() {
        // At the commit index 2 (of term 1), of term 2: installed, the log
        // ends at 2 and is durable to 2 while the snapshot's write is under
        // way. Votes granted meanwhile (which answer no request) are then
        // taken, and the leader they make finds that write outstanding.
        let m = snapshot(2, 2, 2, voters(&[1, 2, 3]));
        let mut n = follower();
        n.step(m.clone()).unwrap();
        n.campaign().unwrap();
        n.step(msg(MessageType::MsgRequestPreVoteResponse, 2, 3))
            .unwrap();
        assert_eq!(n.raft.state, StateRole::Candidate);
        under_way(&mut n);
        let vote = msg(MessageType::MsgRequestVoteResponse, 2, 3);
        assert_eq!(screen(&vote, &n.raft), Ok(()), "durable as far as it goes");
        n.step(vote).unwrap();
        assert_eq!(n.raft.state, StateRole::Leader);
        assert!(panics(|| {
            let _ = n.ready();
        }));
        assert_eq!(
            screen(&m, &follower().raft),
            Err(Refusal::SnapshotContradictsCommit)
        );
        // Below the commit (ignored), at it with its term (the commit stays),
        // past it (installed): as a leader sends them.
        for (index, term) in [(1, 2), (2, 1), (3, 2)] {
            let m = snapshot(2, index, term, voters(&[1, 2, 3]));
            assert_eq!(screen(&m, &follower().raft), Ok(()), "{index} {term}");
        }
    }

    #[test]
    fn an_acknowledgement_past_the_leaders_log_is_refused() {
        let ack = Message {
            index: 9,
            ..msg(MessageType::MsgAppendResponse, 2, 2)
        };
        // Taken, member 2 counts for entries 5 to 9 before they exist; once
        // this leader alone has them, they are committed.
        let mut n = leader();
        n.step(ack.clone()).unwrap();
        for _ in 5..=9 {
            n.propose(Vec::new(), Decision::encode_entry(&[])).unwrap();
        }
        durable(&mut n);
        assert_eq!(n.raft.raft_log.committed, 9, "no majority has 5 to 9");
        assert_eq!(screen(&ack, &leader().raft), Err(Refusal::AckPastLog));
        // Up to the leader's log, a rejection, or another term: passes.
        for (index, reject, term) in [(4, false, 2), (9, true, 2), (9, false, 3), (9, false, 1)] {
            let m = Message {
                index,
                reject,
                ..msg(MessageType::MsgAppendResponse, 2, term)
            };
            assert_eq!(screen(&m, &leader().raft), Ok(()), "{m:?}");
        }
    }

    #[test]
    fn a_pre_vote_refused_at_term_0_is_refused() {
        // A priority below this member's: refused, with term 0.
        let pre_vote = Message {
            priority: -1,
            ..msg(MessageType::MsgRequestPreVote, 2, 1)
        };
        assert!(step_panics(fresh(), &pre_vote));
        assert_eq!(
            screen(&pre_vote, &fresh().raft),
            Err(Refusal::PreVoteRefusedAtTermZero)
        );
        // An honest candidate's is granted; past term 0, refused with a term.
        let honest = msg(MessageType::MsgRequestPreVote, 2, 1);
        assert_eq!(screen(&honest, &fresh().raft), Ok(()));
        assert!(!step_panics(fresh(), &honest));
        let later = Message {
            term: 2,
            ..pre_vote
        };
        assert_eq!(screen(&later, &follower().raft), Ok(()));
        assert!(!step_panics(follower(), &later));
    }

    #[test]
    fn a_vote_granted_before_the_candidates_log_is_durable_is_refused() {
        // Entry 4 being written when member 1 stands for term 2.
        let candidate = || {
            let mut n = follower();
            n.step(append(1, 3, 1, vec![entry(4, 1)])).unwrap();
            let number = under_way(&mut n);
            n.campaign().unwrap();
            n.step(msg(MessageType::MsgRequestPreVoteResponse, 2, 2))
                .unwrap();
            assert_eq!(n.raft.state, StateRole::Candidate);
            (n, number)
        };
        let vote = msg(MessageType::MsgRequestVoteResponse, 2, 2);
        let (n, _) = candidate();
        assert_eq!(screen(&vote, &n.raft), Err(Refusal::VoteBeforeDurable));
        assert!(
            step_panics(n, &vote),
            "become_leader: last_index == persisted"
        );
        // Once durable (when its requests go out), the vote makes it leader.
        let (mut n, number) = candidate();
        n.on_persist_ready(number);
        assert_eq!(screen(&vote, &n.raft), Ok(()));
        n.step(vote.clone()).unwrap();
        assert_eq!(n.raft.state, StateRole::Leader);
        durable(&mut n);
        // A refusal, or one for another term, passes.
        let (n, _) = candidate();
        for m in [
            Message {
                reject: true,
                ..vote.clone()
            },
            Message { term: 3, ..vote },
        ] {
            assert_eq!(screen(&m, &n.raft), Ok(()), "{m:?}");
        }
    }

    #[test]
    fn a_timeout_now_while_a_snapshot_is_made_durable_is_refused() {
        let installing = || {
            let mut n = follower();
            n.step(snapshot(1, 9, 1, voters(&[1, 2, 3]))).unwrap();
            let number = under_way(&mut n);
            (n, number)
        };
        let timeout = msg(MessageType::MsgTimeoutNow, 2, 1);
        let (n, _) = installing();
        assert_eq!(
            screen(&timeout, &n.raft),
            Err(Refusal::TimeoutNowDuringSnapshot)
        );
        assert!(
            step_panics(n, &timeout),
            "hup: entries the snapshot replaced"
        );
        // Durable and applied: the member stands for election at once.
        let (mut n, number) = installing();
        n.on_persist_ready(number);
        n.advance_apply_to(9);
        assert_eq!(screen(&timeout, &n.raft), Ok(()));
        n.step(timeout).unwrap();
        assert_eq!((n.raft.state, n.raft.term), (StateRole::Candidate, 2));
    }

    // ----- forged messages into a running cluster ---------------------------

    const CASES_FORGED: u64 = 500;
    const CASES_RESTORABLE: u64 = 2_000;

    /// A term or index of a forged message, most often near the
    /// receiver's own (its term, its last index), where raft-rs's
    /// conditions turn.
    #[derive(Debug, Clone, Copy)]
    enum Num {
        Zero,
        Near(i8),
        Small(u8),
        Any(u64),
        Max,
    }

    impl Arbitrary for Num {
        fn arbitrary(g: &mut Gen) -> Num {
            match u8::arbitrary(g) % 20 {
                0..=1 => Num::Zero,
                2..=13 => Num::Near(i8::arbitrary(g) % 4),
                14..=16 => Num::Small(u8::arbitrary(g) % 32),
                17..=18 => Num::Any(u64::arbitrary(g)),
                _ => Num::Max,
            }
        }
    }

    impl Num {
        /// A number a member could send: near its own, or small.
        fn tame(g: &mut Gen) -> Num {
            match u8::arbitrary(g) % 10 {
                0 => Num::Zero,
                1 => Num::Small(u8::arbitrary(g) % 32),
                _ => Num::Near(i8::arbitrary(g) % 4),
            }
        }

        /// Tame, or (`wild`: one forged message in four) any number.
        fn pick(g: &mut Gen, wild: bool) -> Num {
            if wild {
                Num::arbitrary(g)
            } else {
                Num::tame(g)
            }
        }

        fn near(self, mine: u64) -> u64 {
            match self {
                Num::Zero => 0,
                Num::Near(d) => mine.saturating_add_signed(i64::from(d)),
                Num::Small(n) => u64::from(n),
                Num::Any(n) => n,
                Num::Max => u64::MAX,
            }
        }
    }

    /// An entry: its index (`None`: the next one), term, type, data.
    #[derive(Debug, Clone)]
    struct ForgedEntry {
        index: Option<Num>,
        term: Num,
        entry_type: i32,
        data: u8,
    }

    impl ForgedEntry {
        fn arbitrary(g: &mut Gen, wild: bool) -> ForgedEntry {
            ForgedEntry {
                index: (u8::arbitrary(g) % 5 == 0).then(|| Num::pick(g, wild)),
                term: Num::pick(g, wild),
                entry_type: match u8::arbitrary(g) % 10 {
                    0..=6 => 0,
                    7 => 1,
                    8 => 2,
                    _ => i32::arbitrary(g),
                },
                data: u8::arbitrary(g),
            }
        }
    }

    /// A message as a peer could forge it: well typed, every field free.
    #[derive(Debug, Clone)]
    struct Forged {
        kind: i32,
        /// The receiver, among the members running (`to` is its id, but
        /// now and then another).
        at: u8,
        to: Option<u8>,
        from: u8,
        term: Num,
        log_term: Num,
        index: Num,
        commit: Num,
        commit_term: Num,
        reject: bool,
        reject_hint: Num,
        request_snapshot: Option<Num>,
        priority: i64,
        transfer: bool,
        entries: Vec<ForgedEntry>,
        snapshot: Option<(Num, Num, Conf, u8)>,
    }

    impl Arbitrary for Forged {
        fn arbitrary(g: &mut Gen) -> Forged {
            let from_a_peer = [3, 4, 5, 6, 7, 8, 9, 14, 17, 18];
            let wild = u8::arbitrary(g) % 4 == 0;
            let num = |g: &mut Gen| Num::pick(g, wild);
            Forged {
                kind: match u8::arbitrary(g) % 10 {
                    0..=7 => *g.choose(&from_a_peer).unwrap(),
                    8 => i32::from(u8::arbitrary(g) % 19),
                    _ => i32::arbitrary(g),
                },
                at: u8::arbitrary(g),
                to: (u8::arbitrary(g) % 64 == 0).then(|| u8::arbitrary(g) % 5),
                from: u8::arbitrary(g),
                term: if wild {
                    Num::arbitrary(g)
                } else {
                    Num::Near(i8::arbitrary(g) % 3)
                },
                log_term: num(g),
                index: num(g),
                commit: num(g),
                commit_term: num(g),
                reject: bool::arbitrary(g),
                reject_hint: num(g),
                request_snapshot: (u8::arbitrary(g) % 8 == 0).then(|| num(g)),
                priority: if u8::arbitrary(g) % 8 == 0 {
                    i64::arbitrary(g)
                } else {
                    0
                },
                transfer: u8::arbitrary(g) % 8 == 0,
                entries: (0..usize::arbitrary(g) % 4)
                    .map(|_| ForgedEntry::arbitrary(g, wild))
                    .collect(),
                snapshot: (u8::arbitrary(g) % 3 > 0).then(|| {
                    let (index, term) = (num(g), num(g));
                    let mut conf = Conf::arbitrary(g);
                    if bool::arbitrary(g) {
                        conf.0 = voters(&[1, 2, 3]);
                    }
                    (index, term, conf, u8::arbitrary(g))
                }),
            }
        }
    }

    /// Data for an entry: none, bytes that mean nothing (one time in 32:
    /// an append of them is refused, and raft-rs is to see the rest), or what a member writes in an entry of its type: a floor;
    /// A configuration change, as raft-rs itself writes one when it
    /// leaves a joint configuration (empty), or of its own type.
    fn entry_data(entry_type: i32, pick: u8) -> Vec<u8> {
        let written = match EntryType::from_i32(entry_type) {
            Some(EntryType::EntryNormal) | None => Decision::encode_entry(&[Decision::Floor {
                epoch: u64::from(pick),
            }]),
            Some(EntryType::EntryConfChange) => {
                prost::Message::encode_to_vec(&raft::prelude::ConfChange::default())
            }
            Some(EntryType::EntryConfChangeV2) => {
                prost::Message::encode_to_vec(&raft::prelude::ConfChangeV2::default())
            }
        };
        // Not on 0 or powers of two, which the generator favours.
        match pick % 32 {
            17 => vec![pick; 5],
            18..=25 => Vec::new(),
            _ => written,
        }
    }

    /// Data for a snapshot: none, bytes that mean nothing, or this
    /// member's table, as a member writes it.
    fn snapshot_data(pick: u8, c: &Cluster, at: u64) -> Vec<u8> {
        let image = || c.replicas[&at].copy().image(c.now, Duration::ZERO);
        // Not on 0 or powers of two, which the generator favours.
        match pick % 8 {
            5 => Vec::new(),
            6 => vec![pick; 5],
            7 => image().encode(),
            _ => SnapshotData {
                cluster: c.replicas[&at].cluster(),
                roster: Default::default(),
                image: image(),
            }
            .encode(),
        }
    }

    impl Forged {
        /// The message, its numbers around where member `at` stands.
        fn message(&self, c: &Cluster, at: u64) -> Message {
            let r = &c.replicas[&at];
            let (term, last) = (r.term(), r.log_span().1);
            let others: Vec<u64> = (1..=3).filter(|&id| id != at).collect();
            let from = match self.from % 64 {
                0 => at,
                1 => 0,
                2 => 4,
                n => others[usize::from(n) % 2],
            };
            let index = self.index.near(last);
            let mut next = index;
            let entries = self
                .entries
                .iter()
                .map(|e| {
                    next = e.index.map_or(next.saturating_add(1), |i| i.near(last));
                    Entry {
                        entry_type: e.entry_type,
                        term: e.term.near(term),
                        index: next,
                        data: entry_data(e.entry_type, e.data),
                        ..Entry::default()
                    }
                })
                .collect();
            let snapshot = self
                .snapshot
                .as_ref()
                .map(|(index, term_of, conf, pick)| Snapshot {
                    data: snapshot_data(*pick, c, at),
                    metadata: Some(SnapshotMetadata {
                        conf_state: Some(conf.0.clone()),
                        index: index.near(last),
                        term: term_of.near(term),
                    }),
                });
            Message {
                msg_type: self.kind,
                to: self.to.map_or(at, u64::from),
                from,
                // Around the receiver's term, from one below to three above.
                term: self.term.near(term + 1),
                log_term: self.log_term.near(term),
                index,
                entries,
                commit: self.commit.near(last),
                commit_term: self.commit_term.near(term),
                snapshot,
                request_snapshot: self.request_snapshot.map_or(0, |n| n.near(last)),
                reject: self.reject,
                reject_hint: self.reject_hint.near(last),
                context: if self.transfer {
                    raft::CAMPAIGN_TRANSFER.to_vec()
                } else {
                    Vec::new()
                },
                priority: self.priority,
                ..Message::default()
            }
        }
    }

    /// Where the cluster starts.
    #[derive(Debug, Clone, Copy)]
    enum Start {
        /// Never ran: every member at term 0, no log.
        Fresh,
        /// A leader elected, grants made.
        Serving,
        /// Grants made past compactions (a snapshot every 4 entries).
        Compacted,
        /// A member cut off while grants are made, then back.
        Lagging,
    }

    /// What happens next.
    #[derive(Debug, Clone)]
    enum Op {
        Forge(Box<Forged>),
        /// Time passes, this many steps.
        Run(u8),
        /// A client's acquire at the member serving, if one does.
        Grant,
        /// A member is cut off (or, past 3, every cut healed).
        Cut(u8),
        /// A member crashes and starts again (without its disk: rejoining).
        Crash(u8, bool),
        /// A write under way: turns without time passing.
        Settle,
    }

    impl Arbitrary for Start {
        fn arbitrary(g: &mut Gen) -> Start {
            *g.choose(&[
                Start::Fresh,
                Start::Serving,
                Start::Compacted,
                Start::Lagging,
            ])
            .unwrap()
        }
    }

    impl Arbitrary for Op {
        fn arbitrary(g: &mut Gen) -> Op {
            match u8::arbitrary(g) % 20 {
                0..=11 => Op::Forge(Box::new(Forged::arbitrary(g))),
                12..=14 => Op::Run(u8::arbitrary(g) % 40),
                15..=16 => Op::Grant,
                17 => Op::Cut(u8::arbitrary(g) % 5),
                18 => Op::Crash(u8::arbitrary(g) % 3 + 1, bool::arbitrary(g)),
                _ => Op::Settle,
            }
        }
    }

    /// Refused and stepped forged messages, over every case.
    #[derive(Debug, Default)]
    struct Tally {
        stepped: u64,
        refused: std::collections::BTreeMap<String, u64>,
    }

    fn grant(c: &mut Cluster, n: u64) {
        let serving = c
            .replicas
            .iter()
            .find(|(_, r)| r.is_serving())
            .map(|(&id, _)| id);
        if let Some(id) = serving {
            let conn = c.connect(id, "H 2 c -\n");
            c.request(id, conn, &format!("A 1 k{n} o 0 60000\n"));
            c.settle();
        }
    }

    fn start(how: Start) -> Cluster {
        let mut c = Cluster::new(if matches!(how, Start::Compacted) {
            4
        } else {
            10_000
        });
        c.honest = false;
        if matches!(how, Start::Fresh) {
            return c;
        }
        c.run(Duration::from_secs(1));
        if matches!(how, Start::Lagging) {
            c.cut.insert(2);
        }
        for n in 0..10 {
            grant(&mut c, n);
            c.run(STEP * 5);
        }
        c.cut.clear();
        c
    }

    fn forged_run(how: Start, ops: &[Op], tally: &mut Tally) {
        let mut c = start(how);
        for (n, op) in ops.iter().enumerate() {
            match op {
                Op::Forge(f) => {
                    let live: Vec<u64> = c.replicas.keys().copied().collect();
                    if live.is_empty() {
                        continue;
                    }
                    let at = live[usize::from(f.at) % live.len()];
                    let m = f.message(&c, at);
                    let before = c.replicas[&at].stats();
                    let now = c.now;
                    let r = c.replicas.get_mut(&at).unwrap();
                    r.handle_message(now, m);
                    let after = r.stats();
                    if after.refused == before.refused {
                        tally.stepped += 1;
                    } else {
                        let why = format!("{:?}", after.last_refusal.unwrap());
                        let why = why.split('(').next().unwrap_or_default().to_string();
                        *tally.refused.entry(why).or_default() += 1;
                    }
                    c.settle();
                }
                Op::Run(steps) => c.run(STEP * u32::from(*steps)),
                Op::Grant => grant(&mut c, n as u64),
                Op::Cut(id) if *id > 3 => c.cut.clear(),
                Op::Cut(id) => {
                    c.cut.insert(u64::from(*id));
                }
                Op::Crash(id, lost) => {
                    let id = u64::from(*id);
                    c.kill(id);
                    if *lost {
                        let empty = Restored::new_cluster(1..=3);
                        c.disks.insert(id, MemoryDisk::new(empty));
                    }
                    // A forged snapshot may have given it another (valid)
                    // configuration, a lie beyond the screen: it refuses
                    // to start (Replica::new), and stays down.
                    let mut voters = c.disks[&id].restored().conf_state.voters;
                    voters.sort_unstable();
                    if voters == [1, 2, 3] {
                        c.start_with(id, *lost);
                    }
                }
                Op::Settle => c.settle(),
            }
        }
        // Whatever was stepped plays out: ticks, elections, catch-up.
        c.cut.clear();
        c.run(Duration::from_secs(1));
    }

    #[test]
    fn a_replica_drops_and_counts_what_it_refuses() {
        let mut c = Cluster::new(10_000);
        c.honest = false;
        c.run(Duration::from_secs(1));
        let leader = c.leader().unwrap();
        let follower = (1..=3).find(|&id| id != leader).unwrap();
        let term = c.replicas[&follower].term();
        let from = |from: u64, kind: i32| Message {
            msg_type: kind,
            from,
            to: follower,
            term,
            ..Message::default()
        };
        let (before, committed) = (
            c.replicas[&follower].stats(),
            c.replicas[&follower].committed(),
        );
        assert_eq!(before.refused, 0);
        c.deliver(from(leader, MessageType::MsgPropose as i32));
        c.deliver(from(leader, 42));
        c.deliver(from(7, MessageType::MsgHeartbeat as i32));
        let stats = c.replicas[&follower].stats();
        assert_eq!(
            (stats.refused, stats.last_refusal),
            (3, Some(Refusal::NotAMember))
        );
        assert_eq!(
            Refusal::UnknownType(42).to_string(),
            "unknown message type 42"
        );
        assert_eq!(
            Refusal::NotFromAPeer(MessageType::MsgPropose).to_string(),
            "MsgPropose is never taken from a peer"
        );
        // Its leader's heartbeat goes through, as before.
        c.deliver(from(leader, MessageType::MsgHeartbeat as i32));
        assert_eq!(c.replicas[&follower].stats().refused, 3);
        c.run(Duration::from_millis(100));
        assert_eq!(c.leader(), Some(leader));
        assert_eq!(c.replicas[&follower].committed(), committed);
    }

    /// No message a peer can send, in any state a cluster is in, panics
    /// a member, then or later: a cluster started fresh, serving, past
    /// compactions or with a member behind, then forged messages (any
    /// type, any numbers, mostly near the receiver's term and log) among
    /// grants, cuts, crashes (some losing the disk) and time, then a
    /// second for it all to play out. raft-rs must see a good share of
    /// them, or the property says little.
    #[test]
    fn no_forged_message_panics_a_member() {
        use std::sync::Mutex;
        static TALLY: Mutex<Option<Tally>> = Mutex::new(None);
        fn prop(how: Start, ops: Vec<Op>) -> TestResult {
            let mut tally = Tally::default();
            let ran = panic::catch_unwind(AssertUnwindSafe(|| forged_run(how, &ops, &mut tally)));
            let mut total = TALLY.lock().unwrap_or_else(|e| e.into_inner());
            let total = total.get_or_insert_with(Tally::default);
            total.stepped += tally.stepped;
            for (why, n) in tally.refused {
                *total.refused.entry(why).or_default() += n;
            }
            match ran {
                Ok(()) => TestResult::passed(),
                Err(e) => {
                    let why = e
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| e.downcast_ref::<&str>().copied())
                        .unwrap_or("a panic");
                    TestResult::error(format!("{why} ({how:?}, {} ops)", ops.len()))
                }
            }
        }
        qc("no_forged_message_panics_a_member", CASES_FORGED)
            .quickcheck(prop as fn(Start, Vec<Op>) -> TestResult);
        let total = TALLY.lock().unwrap().take().unwrap();
        println!("forged messages: {total:?}");
        let refused: u64 = total.refused.values().sum();
        assert!(
            total.stepped > refused / 2,
            "raft-rs saw too few: {total:?}"
        );
    }
}
