//! The requests in flight on the connection, by id: an answer is
//! attributed to one only if id, op and key all agree, and no more than
//! it asked (invariant 2); ids are never reused; nothing is sent before
//! `W`, and what is unanswered never exceeds the window, nor acquires
//! `window - reserved` (invariant 4).

use std::collections::{BTreeMap, BTreeSet};

use super::invariant::{breach, Verdict};
use super::Invariant;
use crate::client::{Config, ConnId, OpId};
use crate::wire::{Answer, AnswerKind, Op};

/// A request in flight on a connection.
#[derive(Debug, Clone)]
pub(super) enum Request {
    Acquire {
        op: OpId,
        key: String,
        lease_ms: u64,
    },
    Release {
        key: String,
        token: u64,
    },
    Renew {
        key: String,
        token: u64,
        lease_ms: u64,
    },
}

/// What an answer to a request may report at most, beyond what the
/// request itself says: the lease its grant still asks for (`u64::MAX`:
/// any), and the `wait_ms` its attempt was sent with.
pub(super) struct Asked {
    pub(super) lease_ms: u64,
    pub(super) wait_ms: u64,
}

pub(super) struct Pending {
    /// Every request id handed out, on any connection.
    ids: BTreeSet<u64>,
    /// The requests unanswered on the current connection.
    requests: BTreeMap<u64, Request>,
    /// The slots of the window that acquires may not take.
    reserved: u64,
}

impl Pending {
    pub(super) fn new(config: &Config) -> Pending {
        Pending {
            ids: BTreeSet::new(),
            requests: BTreeMap::new(),
            reserved: u64::from(config.reserved),
        }
    }

    /// Requests unanswered.
    pub(super) fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether a renewal of `(key, token)` is unanswered.
    pub(super) fn renews(&self, key: &str, token: u64) -> bool {
        self.requests.values().any(
            |r| matches!(r, Request::Renew { key: k, token: t, .. } if k == key && *t == token),
        )
    }

    /// A new connection: nothing is in flight on it.
    pub(super) fn connect(&mut self) {
        self.requests.clear();
    }

    /// The connection closed: what was in flight on it, by id.
    pub(super) fn close(&mut self) -> BTreeMap<u64, Request> {
        core::mem::take(&mut self.requests)
    }

    /// A request `id` (`text`) went out on a connection with `window`
    /// (`None`: before `W`): the window must be known, and the id new. The
    /// window.
    pub(super) fn admit(&mut self, window: Option<u64>, id: u64, text: &str) -> Verdict<u64> {
        let Some(window) = window else {
            return breach(Invariant::Window, format!("{text} sent before W"));
        };
        if !self.ids.insert(id) {
            return breach(
                Invariant::Attribution,
                format!("{text} reuses request id {id}: answers to it could not be told apart"),
            );
        }
        Ok(window)
    }

    /// Request `id` (`text`), admitted, is in flight on `conn`, whose
    /// window is `window`: what is unanswered must fit it.
    pub(super) fn register(
        &mut self,
        id: u64,
        request: Request,
        conn: ConnId,
        window: u64,
        text: &str,
    ) -> Verdict {
        self.requests.insert(id, request);
        let all = self.requests.len() as u64;
        let acquires = self
            .requests
            .values()
            .filter(|r| matches!(r, Request::Acquire { .. }))
            .count() as u64;
        let limit = window.saturating_sub(self.reserved);
        if all > window {
            return breach(
                Invariant::Window,
                format!("{text}: {all} requests unanswered on {conn}, window {window}"),
            );
        }
        if acquires > limit {
            return breach(
                Invariant::Window,
                format!(
                    "{text}: {acquires} acquires unanswered on {conn}, window {window} less {} reserved",
                    window - limit
                ),
            );
        }
        Ok(())
    }

    /// Claims answer `a` (`text`), read on `conn`: the request unanswered
    /// with its id, if op and key agree and it reports no more than was
    /// asked (`asked` tells what beyond the request itself). Unclaimed,
    /// the request stays unanswered: the close treats it as sent and
    /// unanswered.
    pub(super) fn claim(
        &mut self,
        a: &Answer<'_>,
        text: &str,
        conn: ConnId,
        asked: impl FnOnce(&Request) -> Asked,
    ) -> Verdict<Request> {
        let Some(request) = self.requests.get(&a.id) else {
            return breach(
                Invariant::Attribution,
                format!("{text}: no request with that id is unanswered on {conn}"),
            );
        };
        let Asked {
            lease_ms: asked,
            wait_ms,
        } = asked(request);
        let (op, key) = match request {
            Request::Acquire { key, .. } => (Op::Acquire, key.as_str()),
            Request::Release { key, .. } => (Op::Release, key.as_str()),
            Request::Renew { key, .. } => (Op::Renew, key.as_str()),
        };
        if a.op() != op || a.key.as_str() != key {
            return breach(
                Invariant::Attribution,
                format!("{text}: request {} was {op:?} of {key}", a.id),
            );
        }
        let bad = match (a.kind, request) {
            (AnswerKind::Granted { lease_ms, .. } | AnswerKind::Renewed { lease_ms, .. }, _)
                if lease_ms.get() > asked =>
            {
                Some(format!("{text}: a longer lease than the {asked} ms asked"))
            }
            (
                AnswerKind::Granted {
                    waited_ms: None, ..
                },
                _,
            ) => Some(format!(
                "{text}: a G to an acquire on version 2 without waited_ms"
            )),
            (
                AnswerKind::Granted {
                    waited_ms: Some(waited),
                    ..
                },
                Request::Acquire { .. },
            ) if waited > wait_ms => {
                Some(format!("{text}: waited longer than the {wait_ms} ms asked"))
            }
            (AnswerKind::Renewed { token, .. }, Request::Renew { token: asked, .. })
                if token != *asked =>
            {
                Some(format!(
                    "{text}: a renewal of token {asked} answered for another"
                ))
            }
            _ => None,
        };
        if let Some(detail) = bad {
            return breach(Invariant::Attribution, detail);
        }
        Ok(self.requests.remove(&a.id).expect("just found"))
    }
}
