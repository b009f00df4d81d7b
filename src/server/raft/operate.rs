//! What an operator asks of a member (PROTOCOL.md 4.4), on an
//! administrative connection (`server/admin.rs`, frames in
//! [`crate::admin`]): its view of the cluster ([`ClusterStatus`]),
//! a leadership transfer (`handover.rs`), and a snapshot of the committed
//! table (`backup.rs`). Every request gets one clear
//! answer at once: done, or refused and why.

use raft::StateRole;

use super::{AdminRefusal, ClusterId, MemberAddrs, Replica};
use crate::admin::{
    AdminReply, AdminRequest, MemberRole, SnapshotGrant, SnapshotHead, StatusHead, StatusMember,
};
use crate::names::{Endpoint, Name};
use crate::server::ConnId;

/// A member's view of its cluster (PROTOCOL.md 4.4, "Status";
/// [`Replica::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// The member whose view it is.
    pub member: u64,
    /// The cluster's identity, once committed.
    pub cluster: Option<ClusterId>,
    /// The leader it knows.
    pub leader: Option<u64>,
    /// The Raft term.
    pub term: u64,
    /// Its commit index.
    pub commit: u64,
    /// Its applied index.
    pub applied: u64,
    /// Every member of the configuration, by id.
    pub members: Vec<MemberStatus>,
}

/// One member of the configuration, as [`ClusterStatus`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberStatus {
    /// Its Raft id.
    pub id: u64,
    /// Its role.
    pub role: MemberRole,
    /// The address its clients reach it at.
    pub client: Option<Endpoint>,
    /// The address its peers reach it at.
    pub peer: Option<Endpoint>,
    /// Whether the leader heard from it lately: on the leader only.
    pub reachable: Option<bool>,
    /// Its match index: on the leader only.
    pub matched: Option<u64>,
    /// How many entries its log lags the leader's: on the leader only.
    pub lag: Option<u64>,
    /// Its applied index: for the member whose view it is only.
    pub applied: Option<u64>,
}

impl Replica {
    /// This member's view of its cluster: roles and addresses; on the
    /// leader, how far each member is.
    pub fn status(&self) -> ClusterStatus {
        let raft = &self.node.raft;
        let me = raft.id;
        let leads = raft.state == StateRole::Leader;
        let last = raft.raft_log.last_index();
        let conf = raft.prs().conf();
        let voters: Vec<u64> = conf.voters().ids().iter().collect();
        let learners = conf.learners().iter().copied();
        let mut ids: Vec<u64> = voters.iter().copied().chain(learners).collect();
        ids.sort_unstable();
        ids.dedup();
        let members = ids
            .into_iter()
            .map(|id| {
                let progress = leads.then(|| raft.prs().get(id)).flatten();
                MemberStatus {
                    id,
                    role: if id == raft.leader_id {
                        MemberRole::Leader
                    } else if voters.contains(&id) {
                        MemberRole::Follower
                    } else {
                        MemberRole::Learner
                    },
                    client: self.roster.client(id).cloned(),
                    peer: self.roster.peer(id).cloned(),
                    reachable: progress.map(|p| id == me || p.recent_active),
                    matched: progress.map(|p| p.matched),
                    lag: progress.map(|p| last.saturating_sub(p.matched)),
                    applied: (id == me).then_some(self.applied),
                }
            })
            .collect();
        ClusterStatus {
            member: me,
            cluster: self.cluster,
            leader: (raft.leader_id != 0).then_some(raft.leader_id),
            term: raft.term,
            commit: raft.raft_log.committed,
            applied: self.applied,
            members,
        }
    }

    /// Answers every request operators sent since the last turn.
    pub(super) fn answer_operators(&mut self) {
        while let Some((conn, request)) = self.server.poll_admin() {
            match request {
                AdminRequest::Status { id } => self.answer_status(conn, id),
                AdminRequest::Transfer { id, to } => {
                    let reply = match self.transfer_leadership(self.now, to) {
                        Ok(to) => AdminReply::Transferring { id, to },
                        Err(refused) => self.refused(id, refused),
                    };
                    self.server.answer_admin(conn, &reply);
                }
                AdminRequest::Add {
                    id,
                    member,
                    client,
                    peer,
                } => {
                    let addrs = MemberAddrs::new(client, Some(peer));
                    let reply = match self.add_member(self.now, member, addrs) {
                        Ok(()) => AdminReply::Adding { id, member },
                        Err(refused) => self.refused(id, refused),
                    };
                    self.server.answer_admin(conn, &reply);
                }
                AdminRequest::Remove { id, member, force } => {
                    let reply = match self.remove_member(self.now, member, force) {
                        Ok(()) => AdminReply::Removing { id, member },
                        Err(refused) => self.refused(id, refused),
                    };
                    self.server.answer_admin(conn, &reply);
                }
                AdminRequest::Snapshot { id } => self.answer_snapshot(conn, id),
                // The desk takes hellos itself and never queues one.
                AdminRequest::Hello { .. } => {}
            }
        }
    }

    fn answer_status(&mut self, conn: ConnId, id: u64) {
        let status = self.status();
        let head = StatusHead {
            id,
            member: status.member,
            cluster: status.cluster.map(ClusterId::get),
            leader: status.leader,
            term: status.term,
            commit: status.commit,
            applied: status.applied,
            count: status.members.len() as u64,
        };
        self.server.answer_admin(conn, &AdminReply::Status(head));
        for m in status.members {
            let line = StatusMember {
                id,
                member: m.id,
                role: m.role,
                client: m.client,
                peer: m.peer,
                reachable: m.reachable,
                matched: m.matched,
                lag: m.lag,
                applied: m.applied,
            };
            self.server.answer_admin(conn, &AdminReply::Member(line));
        }
    }

    /// The leader's committed table (`backup.rs`), one `SG` per grant;
    /// a member that does not lead names the leader.
    fn answer_snapshot(&mut self, conn: ConnId, id: u64) {
        if self.node.raft.state != StateRole::Leader {
            let reply = self.refused(id, self.not_leader());
            self.server.answer_admin(conn, &reply);
            return;
        }
        let backup = self.backup();
        let head = SnapshotHead {
            id,
            cluster: backup.cluster.map(ClusterId::get),
            index: backup.index,
            floor: backup.floor,
            count: backup.grants.len() as u64,
        };
        self.server
            .answer_admin(conn, &AdminReply::SnapshotHead(head));
        for g in backup.grants {
            let grant = SnapshotGrant {
                id,
                key: g.key,
                token: g.token,
                remaining_ms: g.remaining_ms,
            };
            self.server
                .answer_admin(conn, &AdminReply::SnapshotGrant(grant));
        }
    }

    /// `NO <id> <error> <address>`: the client address of the member to
    /// ask instead, when there is one (the leader this member knows, or
    /// the member it hands over to).
    fn refused(&self, id: u64, refused: AdminRefusal) -> AdminReply {
        let to = match refused {
            AdminRefusal::HandingOver { to } => to,
            _ => self.node.raft.leader_id,
        };
        let leader = (to != self.node.raft.id)
            .then(|| self.roster.client(to).cloned())
            .flatten();
        AdminReply::Refused {
            id,
            error: Name::new(refused.code()).expect("every refusal's code is an atom"),
            leader,
        }
    }
}
