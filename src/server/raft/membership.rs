//! Membership changes (PROTOCOL.md 4.4, "Membership changes", "Adding",
//! "Removing"), through raft-rs's own machinery: `ConfChangeV2`s, learners,
//! joint consensus. Which member is where ([`Roster`]), what a change may
//! not do, and when the leader takes the next step.
//!
//! - **One change at a time.** raft-rs silently turns a change proposed
//!   while another is pending into an empty entry: a change is refused
//!   (`change_in_flight`) while one is proposed and not applied, or while
//!   the configuration is joint.
//! - **Adding** proposes the new member as a *learner*, with its addresses
//!   in the change's context. Every member that applies that change
//!   compacts its log at once, so that the learner (whose log is empty) is
//!   sent a snapshot, which holds the whole configuration (replaying the
//!   log from its start would not: the first configuration is not in it).
//!   The leader promotes a learner it heard from lately once its log is
//!   within [`PROMOTE_WITHIN`] entries of its own and it is not taking a
//!   snapshot.
//! - **Voters change by joint consensus**: promotions and removals use
//!   the `Explicit` transition, so the change commits under the old and the
//!   new majority both; whoever leads while the configuration is joint
//!   proposes the leave (raft-rs's `Auto` transition would take the simple
//!   path for a single change, and leave the leave to no one once its
//!   leader is gone).
//! - **Removing** is refused when the voters that would remain, of those
//!   the leader heard from within an election timeout, could not form a
//!   majority of the new configuration (`would_lose_majority`), unless
//!   forced. A leader asked to remove itself hands over first and says so
//!   (`handing_over`): the request is then the new leader's to carry out.
//! - **A member applies each change as it commits**: raft-rs takes it, the
//!   roster follows it, and the log store keeps the configuration its
//!   next snapshot holds. A member that finds itself out of a
//!   configuration it was in stops for good (`ReplicaEvent::Removed`).

use std::collections::BTreeMap;

use raft::prelude::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
    Entry, EntryType,
};
use raft::{ProgressState, StateRole};
use raft_proto::ConfChangeI as _;

use super::{AdminRefusal, Handover, Leadership, Replica, ReplicaEvent};
use crate::names::Endpoint;
use crate::time::Time;

/// A learner is promoted once its log is within this many entries of the
/// leader's.
pub const PROMOTE_WITHIN: u64 = 10;

/// A member's addresses: where its clients reach it (what `M` names), and
/// where its peers do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberAddrs {
    /// The client address.
    pub client: Endpoint,
    /// The peer address, when known.
    pub peer: Option<Endpoint>,
}

impl MemberAddrs {
    /// A member reached at `client` by its clients and at `peer` by its
    /// peers.
    pub fn new(client: Endpoint, peer: Option<Endpoint>) -> MemberAddrs {
        MemberAddrs { client, peer }
    }

    /// `id client peer|-`: what a change's context and a snapshot carry.
    pub(super) fn encode(&self, id: u64) -> String {
        let peer = self.peer.as_ref().map_or("-", Endpoint::as_str);
        format!("{id} {} {peer}", self.client.as_str())
    }

    pub(super) fn decode(text: &str) -> Option<(u64, MemberAddrs)> {
        let mut fields = text.split(' ');
        let id = fields.next()?.parse().ok().filter(|&id| id != 0)?;
        let client = Endpoint::new(fields.next()?).ok()?;
        let peer = match fields.next()? {
            "-" => None,
            peer => Some(Endpoint::new(peer).ok()?),
        };
        fields
            .next()
            .is_none()
            .then_some((id, MemberAddrs { client, peer }))
    }
}

/// Every member's addresses: the configuration's, as the log and its
/// snapshots carry them, over what the start was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Roster {
    members: BTreeMap<u64, MemberAddrs>,
}

impl Roster {
    /// The members a start was given: client addresses, and peer
    /// addresses where known.
    pub(super) fn given(
        clients: BTreeMap<u64, Endpoint>,
        peers: &BTreeMap<u64, Endpoint>,
    ) -> Roster {
        let members = clients
            .into_iter()
            .map(|(id, client)| (id, MemberAddrs::new(client, peers.get(&id).cloned())))
            .collect();
        Roster { members }
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.members.contains_key(&id)
    }

    pub(super) fn client(&self, id: u64) -> Option<&Endpoint> {
        self.members.get(&id).map(|m| &m.client)
    }

    pub(super) fn peer(&self, id: u64) -> Option<&Endpoint> {
        self.members.get(&id).and_then(|m| m.peer.as_ref())
    }

    pub(super) fn insert(&mut self, id: u64, addrs: MemberAddrs) {
        self.members.insert(id, addrs);
    }

    /// Takes the addresses a snapshot carried (none: one written before
    /// snapshots carried them).
    pub(super) fn adopt(&mut self, snapshot: &Roster) {
        for (&id, addrs) in &snapshot.members {
            self.members.insert(id, addrs.clone());
        }
    }

    /// Keeps the members of `conf` only.
    pub(super) fn keep(&mut self, conf: &ConfState) {
        self.members.retain(|id, _| in_conf(conf, *id));
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &MemberAddrs)> {
        self.members.iter().map(|(&id, a)| (id, a))
    }

    pub(super) fn from_members(members: BTreeMap<u64, MemberAddrs>) -> Roster {
        Roster { members }
    }
}

/// Whether `id` is in `conf`, in any role.
pub(super) fn in_conf(conf: &ConfState, id: u64) -> bool {
    conf.voters.contains(&id)
        || conf.learners.contains(&id)
        || conf.voters_outgoing.contains(&id)
        || conf.learners_next.contains(&id)
}

/// Whether `id` votes in `conf` (in a joint configuration, in either
/// half): a member that does not serves no client.
pub(super) fn votes(conf: &ConfState, id: u64) -> bool {
    conf.voters.contains(&id) || conf.voters_outgoing.contains(&id)
}

/// What membership remembers between turns.
#[derive(Debug, Default)]
pub(super) struct Membership {
    /// When each peer was last heard from (a message stepped).
    heard: BTreeMap<u64, Time>,
    /// This member was in a configuration it applied: found out of a later
    /// one, it was removed.
    seen_self: bool,
}

impl Membership {
    pub(super) fn new(seen_self: bool) -> Membership {
        Membership {
            heard: BTreeMap::new(),
            seen_self,
        }
    }

    pub(super) fn heard_from(&mut self, peer: u64, now: Time) {
        self.heard.insert(peer, now);
    }

    /// Whether `peer` was heard from within `within` of `now`.
    pub(super) fn heard_lately(&self, peer: u64, now: Time, within: core::time::Duration) -> bool {
        self.heard
            .get(&peer)
            .is_some_and(|&at| now.saturating_duration_since(at) < within)
    }
}

fn single(change_type: ConfChangeType, node_id: u64) -> ConfChangeSingle {
    ConfChangeSingle {
        change_type: change_type as i32,
        node_id,
    }
}

/// A change of one member, by joint consensus (`Explicit`), or the simple
/// path (`Auto`, for a learner, which changes no majority).
fn change(
    transition: ConfChangeTransition,
    change: ConfChangeSingle,
    context: Vec<u8>,
) -> ConfChangeV2 {
    ConfChangeV2 {
        transition: transition as i32,
        changes: vec![change],
        context,
    }
}

impl Replica {
    /// Adds member `id`, reached at `addrs`, as a learner (PROTOCOL.md 4.4,
    /// "Adding"): it is promoted to voter once caught up. Refused by a
    /// member that does not lead, for a member already in the
    /// configuration, and while another change is under way.
    pub fn add_member(
        &mut self,
        now: Time,
        id: u64,
        addrs: MemberAddrs,
    ) -> Result<(), AdminRefusal> {
        self.input(now);
        self.may_change()?;
        if id == 0 || in_conf(self.conf(), id) {
            return Err(AdminRefusal::AlreadyMember { id });
        }
        let cc = change(
            ConfChangeTransition::Auto,
            single(ConfChangeType::AddLearnerNode, id),
            addrs.encode(id).into_bytes(),
        );
        self.propose_change(cc)
    }

    /// Removes member `id` (PROTOCOL.md 4.4, "Removing"), by joint
    /// consensus. Refused by a member that does not lead, for a member not
    /// in the configuration, while another change is under way, and
    /// (unless `force`) when the voters that would remain, of those this
    /// leader heard from lately, could not form a majority of the new
    /// configuration. Asked to remove itself, a leader hands over first
    /// and refuses with [`AdminRefusal::HandingOver`]: the member it hands
    /// to is then to be asked.
    pub fn remove_member(&mut self, now: Time, id: u64, force: bool) -> Result<(), AdminRefusal> {
        self.input(now);
        self.may_change()?;
        let conf = self.conf().clone();
        if !in_conf(&conf, id) {
            return Err(AdminRefusal::UnknownMember { id });
        }
        let me = self.node.raft.id;
        if id == me {
            let to = Handover::choose(self.node.raft.prs(), me, None)?;
            self.begin_handover(to);
            return Err(AdminRefusal::HandingOver { to });
        }
        let remaining: Vec<u64> = conf.voters.iter().copied().filter(|&v| v != id).collect();
        let heard = remaining
            .iter()
            .filter(|&&v| v == me || self.heard_lately(v))
            .count();
        if !force && heard < remaining.len() / 2 + 1 {
            return Err(AdminRefusal::WouldLoseMajority);
        }
        let transition = if conf.voters.contains(&id) {
            ConfChangeTransition::Explicit
        } else {
            ConfChangeTransition::Auto
        };
        let cc = change(
            transition,
            single(ConfChangeType::RemoveNode, id),
            Vec::new(),
        );
        self.propose_change(cc)
    }

    /// The configuration as this member applied it (its log store keeps
    /// it with raft-rs's, for the next snapshot).
    pub(super) fn conf(&self) -> &ConfState {
        self.node.store().conf_state()
    }

    /// The voters of the configuration this member applied and, while it
    /// is joint, the outgoing ones; and the learners (for the simulator's
    /// checks and its changes).
    #[cfg(feature = "sim")]
    pub(crate) fn configuration(&self) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
        let conf = self.conf();
        (
            conf.voters.clone(),
            conf.voters_outgoing.clone(),
            conf.learners.clone(),
        )
    }

    /// Whether a change may be proposed now: this member serves as leader,
    /// hands nothing over, and no change is under way.
    fn may_change(&self) -> Result<(), AdminRefusal> {
        if !self.is_serving() || self.node.raft.lead_transferee.is_some() {
            return Err(self.not_leader());
        }
        if self.change_in_flight() {
            return Err(AdminRefusal::ChangeInFlight);
        }
        Ok(())
    }

    /// A change is proposed and not applied, or the configuration is joint.
    fn change_in_flight(&self) -> bool {
        let raft = &self.node.raft;
        raft.pending_conf_index > raft.raft_log.applied || !self.conf().voters_outgoing.is_empty()
    }

    fn heard_lately(&self, peer: u64) -> bool {
        self.membership
            .heard_lately(peer, self.now, self.ticker.election_timeout())
    }

    /// Proposes `cc`; refused if raft-rs did not take it as a change.
    fn propose_change(&mut self, cc: ConfChangeV2) -> Result<(), AdminRefusal> {
        let index = self.node.raft.raft_log.last_index() + 1;
        let taken = self.node.propose_conf_change(Vec::new(), cc).is_ok()
            && self.node.raft.raft_log.last_index() == index
            && self.node.raft.pending_conf_index == index;
        self.dirty = true;
        if taken {
            Ok(())
        } else {
            Err(AdminRefusal::ChangeInFlight)
        }
    }

    /// The leader's next step of a change under way: leave a joint
    /// configuration; promote a learner that caught up.
    pub(super) fn drive_membership(&mut self) {
        if !self.is_serving()
            || self.node.raft.state != StateRole::Leader
            || self.node.raft.lead_transferee.is_some()
        {
            return;
        }
        let raft = &self.node.raft;
        if raft.pending_conf_index > raft.raft_log.applied {
            return;
        }
        let conf = self.conf();
        if !conf.voters_outgoing.is_empty() {
            let me = raft.id;
            if !conf.voters.contains(&me) {
                // A leader the change leaves out hands over to a member it
                // keeps, which proposes the leave: raft-rs's leader would
                // lead on past its own removal.
                let kept = conf.voters.clone();
                if let Some(to) = Handover::most_caught_up(raft.prs(), me, |id| kept.contains(&id))
                {
                    self.begin_handover(to);
                }
                return;
            }
            // Joint: whoever leads now proposes the leave.
            let _ = self.propose_change(ConfChangeV2::default());
            return;
        }
        let last = raft.raft_log.last_index();
        let ready = conf.learners.iter().copied().find(|&l| {
            raft.prs().get(l).is_some_and(|p| {
                p.matched + PROMOTE_WITHIN >= last && p.state != ProgressState::Snapshot
            }) && self.heard_lately(l)
        });
        if let Some(learner) = ready {
            let cc = change(
                ConfChangeTransition::Explicit,
                single(ConfChangeType::AddNode, learner),
                Vec::new(),
            );
            let _ = self.propose_change(cc);
        }
    }

    /// Applies a committed configuration change; `false` if it cannot be
    /// read or applied.
    pub(super) fn apply_change(&mut self, entry: &Entry) -> bool {
        let cc = if entry.entry_type == EntryType::EntryConfChangeV2 as i32 {
            prost::Message::decode(entry.data.as_slice()).ok()
        } else {
            <ConfChange as prost::Message>::decode(entry.data.as_slice())
                .ok()
                .map(|cc| cc.into_v2())
        };
        let Some(cc) = cc else {
            return false;
        };
        let cc: ConfChangeV2 = cc;
        let added_learner = cc
            .changes
            .iter()
            .any(|c| c.change_type == ConfChangeType::AddLearnerNode as i32);
        if added_learner {
            if let Some((id, addrs)) = core::str::from_utf8(&cc.context)
                .ok()
                .and_then(MemberAddrs::decode)
            {
                self.roster.insert(id, addrs);
            }
        }
        let Ok(conf) = self.node.apply_conf_change(&cc) else {
            return false;
        };
        self.node.mut_store().set_conf_state(conf.clone());
        self.roster.keep(&conf);
        self.tell_members();
        if !self.still_member() {
            return true;
        }
        if added_learner {
            // The learner is to be sent a snapshot: see the module's docs.
            self.compact_now = true;
        }
        self.dirty = true;
        true
    }

    /// Tells the driver the members' peer addresses
    /// ([`ReplicaEvent::Members`]).
    pub(super) fn tell_members(&mut self) {
        let peers = self
            .roster
            .iter()
            .filter_map(|(id, addrs)| Some((id, addrs.peer.clone()?)))
            .collect();
        // The roster is the configuration applied by now, never an older
        // one: what a peer may be told of it is as of this index.
        let index = self.applied;
        self.outputs
            .push_back(super::Output::Event(ReplicaEvent::Members { peers, index }));
    }

    /// A member said this one is not in its configuration as of the
    /// entry at `index` (its answer to this member's peer hello; PROTOCOL.md
    /// 4.4, "Removing"): a member removed while it was down learns so,
    /// and stops for good, as it would had it applied its removal. Only
    /// when that cannot be a member that has not yet applied this one's
    /// addition: this member was in a configuration, so committed its
    /// addition, and `index` is past everything it knows committed, so the
    /// configuration that leaves it out came later. `from` must be a
    /// member of its own configuration, of this member's cluster (its
    /// driver checked the identity).
    pub fn handle_not_member(&mut self, now: Time, from: u64, index: u64) {
        self.input(now);
        let raft = &self.node.raft;
        let told = self.membership.seen_self
            && self.cluster.is_some()
            && from != raft.id
            && in_conf(self.conf(), from)
            && index > raft.raft_log.committed
            && self.leadership != Leadership::Stopped;
        if told {
            self.outputs
                .push_back(super::Output::Event(ReplicaEvent::ToldRemoved {
                    by: from,
                    index,
                }));
            self.stop(ReplicaEvent::Removed);
        }
    }

    /// Whether this member is in the configuration it applied (a change,
    /// or a snapshot's); found out of it after it was in one, it was
    /// removed, and stops for good.
    pub(super) fn still_member(&mut self) -> bool {
        let me = self.node.raft.id;
        if in_conf(self.conf(), me) {
            self.membership.seen_self = true;
        } else if self.membership.seen_self {
            self.stop(ReplicaEvent::Removed);
            return false;
        }
        true
    }
}
