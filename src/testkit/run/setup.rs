//! A run's settings ([`Setup`]) and their byte encoding.

use core::time::Duration;

use arbitrary::Unstructured;

use super::{byte, ep, GRACES_MS, MAX_LEASES_MS};
use crate::client::{BusyPolicy, CancelPolicy, Config};
use crate::names::Name;
use crate::testkit::model::ServerConfig;

/// The settings of one run: every field is a small number, read modulo the
/// size of its range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Setup {
    /// Seeds the client's generator and the server's.
    pub seed: u64,
    /// The server's window: `2 + window % 7`.
    pub window: u8,
    /// The client's reserved slots: `1 + reserved % 4` (clamped to
    /// `window - 1` by the client).
    pub reserved: u8,
    /// [`CancelPolicy::KeepWaiter`] instead of [`CancelPolicy::Close`].
    pub keep_waiter: bool,
    /// [`BusyPolicy::FailFast`] instead of [`BusyPolicy::Retry`].
    pub fail_fast: bool,
    /// The client gives up while unreachable
    /// ([`Config::give_up_while_unreachable`]).
    pub give_up: bool,
    /// The client's release attempts: `1 + release_attempts % 8`.
    pub release_attempts: u8,
    /// The server's queue limit per key: `queue_limit % 4` (0: every acquire
    /// that would wait is answered `B`).
    pub queue_limit: u8,
    /// The server's longest lease: [`MAX_LEASES_MS`]`[max_lease % 4]`.
    pub max_lease: u8,
    /// The client's capacity for open acquires: 1, 3, or 64 otherwise
    /// (`max_acquires % 8` = 0, 1, or more).
    pub max_acquires: u8,
    /// The client's answer grace: [`GRACES_MS`]`[answer_grace % 3]`.
    pub answer_grace: u8,
}

impl Setup {
    /// Bytes taken by [`Setup::encode`].
    pub const ENCODED_LEN: usize = 16;

    /// The client's configuration: endpoints `a:1` and `b:2`, `c:3`
    /// allowlisted besides, client id `tk`.
    pub fn client_config(&self) -> Config {
        let mut c = Config::new([ep("a:1"), ep("b:2")], Name::new("tk").expect("atom"));
        c.allow = vec![ep("c:3")];
        c.seed = self.seed;
        c.reserved = 1 + u32::from(self.reserved % 4);
        c.cancel = if self.keep_waiter {
            CancelPolicy::KeepWaiter
        } else {
            CancelPolicy::Close
        };
        c.busy = if self.fail_fast {
            BusyPolicy::FailFast
        } else {
            BusyPolicy::Retry
        };
        c.release_attempts = 1 + u32::from(self.release_attempts % 8);
        c.answer_grace = Duration::from_millis(GRACES_MS[usize::from(self.answer_grace % 3)]);
        c.max_acquires = match self.max_acquires % 8 {
            0 => 1,
            1 => 3,
            _ => 64,
        };
        c.give_up_while_unreachable = self.give_up;
        c
    }

    /// The model server's configuration.
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig {
            node: "model-1".to_owned(),
            window: 2 + u64::from(self.window % 7),
            max_lease_ms: MAX_LEASES_MS[usize::from(self.max_lease % 4)],
            queue_limit: usize::from(self.queue_limit % 4),
            total_waiters: 16,
            seed: self.seed ^ 0x5eed_5eed_5eed_5eed,
        }
    }

    /// Reads a setup: 8 bytes of seed (little-endian), then one byte per
    /// field. Missing bytes read as zero.
    pub fn decode(u: &mut Unstructured<'_>) -> Setup {
        let mut seed = [0u8; 8];
        for b in &mut seed {
            *b = byte(u);
        }
        let window = byte(u);
        let reserved = byte(u);
        let flags = byte(u);
        let release_attempts = byte(u);
        let queue_limit = byte(u);
        let max_lease = byte(u);
        let max_acquires = byte(u);
        let answer_grace = byte(u);
        Setup {
            seed: u64::from_le_bytes(seed),
            window,
            reserved,
            keep_waiter: flags & 1 != 0,
            fail_fast: flags & 2 != 0,
            give_up: flags & 4 != 0,
            release_attempts,
            queue_limit,
            max_lease,
            max_acquires,
            answer_grace,
        }
    }

    /// The inverse of [`Setup::decode`].
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seed.to_le_bytes());
        out.extend_from_slice(&[
            self.window,
            self.reserved,
            u8::from(self.keep_waiter)
                | u8::from(self.fail_fast) << 1
                | u8::from(self.give_up) << 2,
            self.release_attempts,
            self.queue_limit,
            self.max_lease,
            self.max_acquires,
            self.answer_grace,
        ]);
    }
}
