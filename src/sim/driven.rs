//! The client a slot of the world drives: a client core, or (feature
//! `sabotage`) a bad client wrapped around one. Both offer the part of the
//! core's interface that the world uses, with the core's signatures.

use core::time::Duration;

#[cfg(feature = "sabotage")]
use super::sabotage::BadClient;
use super::SimConfig;
use crate::client::{Action, Client, Config, ConnId, Error, Event, Grant, OpId, TransportEnd};
use crate::names::{Endpoint, Key, Name};
use crate::time::Time;

/// A client core, or a bad client around one.
pub(super) enum Driven {
    /// The core, unwrapped: every rule kept.
    Core(Client),
    /// The core inside a wrapper that breaks one rule.
    #[cfg(feature = "sabotage")]
    Bad(BadClient),
}

/// Methods that pass their call on to the client inside, whichever it is.
macro_rules! forward {
    ($(fn $name:ident(&mut self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?;)*) => {
        $(
            pub(super) fn $name(&mut self $(, $arg: $ty)*) $(-> $ret)? {
                match self {
                    Driven::Core(client) => client.$name($($arg),*),
                    #[cfg(feature = "sabotage")]
                    Driven::Bad(client) => client.$name($($arg),*),
                }
            }
        )*
    };
}

impl Driven {
    /// The client for `config`: the core itself, or, when `sim` names a
    /// sabotage, the core inside that bad client (which may allowlist the
    /// addresses in `hintable`).
    #[cfg_attr(not(feature = "sabotage"), allow(unused_variables))]
    pub(super) fn new(
        config: &Config,
        sim: &SimConfig,
        hintable: &[Endpoint],
        now: Time,
    ) -> Driven {
        #[cfg(feature = "sabotage")]
        if let Some(sabotage) = sim.sabotage.filter(|s| !s.breaks_the_server()) {
            let bad = BadClient::new(sabotage, config, hintable, now);
            return Driven::Bad(bad.expect("the simulator's configs are valid"));
        }
        let core = Client::new(config.clone(), now);
        Driven::Core(core.expect("the simulator's configs are valid"))
    }

    /// The core itself, as its checker reads it.
    pub(super) fn core(&self) -> &Client {
        match self {
            Driven::Core(client) => client,
            #[cfg(feature = "sabotage")]
            Driven::Bad(client) => client.core(),
        }
    }

    /// The next deadline. A bad client has no timers of its own: its
    /// core's are its.
    pub(super) fn poll_timeout(&self) -> Option<Time> {
        self.core().poll_timeout()
    }

    /// Whether the client has shut down for good (its core has).
    pub(super) fn is_finished(&self) -> bool {
        self.core().is_finished()
    }

    forward! {
        fn acquire(&mut self, now: Time, key: Key, owner: Name, wait: Duration, lease: Duration) -> Result<OpId, Error>;
        fn acquire_renewing(&mut self, now: Time, key: Key, owner: Name, wait: Duration, lease: Duration, limit: Option<Duration>) -> Result<OpId, Error>;
        fn renew(&mut self, now: Time, grant: &Grant, lease: Option<Duration>) -> Result<(), Error>;
        fn auto_renew(&mut self, now: Time, grant: &Grant, limit: Option<Duration>) -> Result<(), Error>;
        fn stop_renewing(&mut self, now: Time, grant: &Grant) -> Result<(), Error>;
        fn release(&mut self, now: Time, grant: &Grant) -> Result<OpId, Error>;
        fn undeliverable(&mut self, now: Time, grant: &Grant) -> Result<(), Error>;
        fn cancel(&mut self, now: Time, op: OpId) -> Result<(), Error>;
        fn shutdown(&mut self, now: Time, budget: Duration) -> Result<(), Error>;
        fn handle_connected(&mut self, now: Time, conn: ConnId);
        fn handle_connect_failed(&mut self, now: Time, conn: ConnId);
        fn handle_transport_closed(&mut self, now: Time, conn: ConnId, end: TransportEnd);
        fn handle_bytes(&mut self, now: Time, conn: ConnId, data: &[u8]);
        fn handle_timeout(&mut self, now: Time);
        fn poll_action(&mut self) -> Option<Action>;
        fn poll_event(&mut self) -> Option<Event>;
    }
}
