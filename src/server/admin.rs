//! Administrative connections (PROTOCOL.md 4.4, "Who may ask"; the frames
//! are [`crate::admin`]'s): who may open one, and the requests that
//! came on them, for the core that administers to answer.
//!
//! A server opens its desk only when it is a member of a replicated
//! cluster ([`Server::open_admin`]); until then an administrative hello is
//! answered `E not_active`. An administrative connection is admitted by
//! any member, leader or not, and stays open when the member's role
//! changes: it is not a client of the lock table, and hears nothing about
//! it (no `M`, no `L`).
//!
//! [`Server::open_admin`]: super::Server::open_admin

use std::collections::VecDeque;

use super::credential::Credential;
use super::ConnId;
use crate::admin::AdminRequest;
use crate::names::Name;

/// Who may open an administrative connection (PROTOCOL.md 4.4, "Who may
/// ask": the peer credential, or a certificate the peer CA signed).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminAccess {
    /// Whoever offers this credential: the cluster's peer credential.
    Credential(Name),
    /// Anyone: the members authenticate nobody either (`--raft-insecure`,
    /// loopback addresses only).
    Open,
    /// Every connection to the client address: its driver admits only
    /// clients that present a certificate the peer CA signed (mutual TLS,
    /// the peers' CA on the client address too), so each may ask, with
    /// or without the credential.
    Certified,
}

/// The desk: who may come, and what was asked and not yet taken.
pub(super) struct AdminDesk {
    /// The answering member's Raft id, said in `WA`.
    pub(super) member: u64,
    /// `None`: open to anyone.
    credential: Option<Credential>,
    /// Requests in the order they came, for [`super::Server::poll_admin`].
    pub(super) inbox: VecDeque<(ConnId, AdminRequest)>,
}

impl AdminDesk {
    pub(super) fn new(member: u64, access: &AdminAccess) -> AdminDesk {
        AdminDesk {
            member,
            credential: match access {
                AdminAccess::Credential(c) => Some(Credential::new(c)),
                AdminAccess::Open | AdminAccess::Certified => None,
            },
            inbox: VecDeque::new(),
        }
    }

    /// Whether `offered` (`None`: `-`) admits its bearer, compared in
    /// constant time.
    pub(super) fn admits(&self, offered: Option<&Name>) -> bool {
        match (&self.credential, offered) {
            (None, _) => true,
            (Some(required), Some(offered)) => required.admits(offered.as_bytes()),
            (Some(_), None) => false,
        }
    }
}
