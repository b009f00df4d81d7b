//! What a part's unit tests give it in place of the client (tests only):
//! a configuration, the time, and the outputs an [`Fx`] writes to.

use std::collections::VecDeque;
use std::time::Duration;

use super::stats::EventQueue;
use super::store::SendBuffer;
use super::{Action, Config, Event, Fx};
use crate::names::{Endpoint, Name};
use crate::time::Time;

/// `ms` milliseconds after the start.
pub(crate) fn at_ms(ms: u64) -> Time {
    Time::ZERO.saturating_add(Duration::from_millis(ms))
}

/// A part's world: its configuration, the time, and its outputs.
pub(crate) struct Harness {
    pub(crate) config: Config,
    pub(crate) now: Time,
    pub(crate) actions: VecDeque<Action>,
    pub(crate) events: EventQueue,
    pub(crate) send: SendBuffer,
}

impl Harness {
    /// Endpoints `a:1`, `b:1`, `c:1`, and the defaults.
    pub(crate) fn new() -> Harness {
        let endpoints = ["a:1", "b:1", "c:1"].map(|e| Endpoint::new(e).expect("an endpoint"));
        Harness::with(Config::new(endpoints, Name::new("me").expect("a name")))
    }

    pub(crate) fn with(config: Config) -> Harness {
        Harness {
            config,
            now: Time::ZERO,
            actions: VecDeque::new(),
            events: EventQueue::default(),
            send: SendBuffer::default(),
        }
    }

    /// The effects of one call.
    pub(crate) fn fx(&mut self) -> Fx<'_> {
        Fx {
            now: self.now,
            config: &self.config,
            actions: &mut self.actions,
            events: &mut self.events,
            send: &mut self.send,
        }
    }

    /// Time passes: it is `ms` milliseconds after the start.
    pub(crate) fn at(&mut self, ms: u64) -> Time {
        self.now = at_ms(ms);
        self.now
    }

    /// The events queued, taken.
    pub(crate) fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.events.pop_front()).collect()
    }

    /// The bytes encoded, taken, as text.
    pub(crate) fn sent(&mut self) -> String {
        let mut text = String::new();
        while let Some(bytes) = self.send.take() {
            text.push_str(core::str::from_utf8(&bytes).expect("ASCII"));
        }
        text
    }
}
