//! The notices as `tracing` events (feature `tracing`), whichever way the
//! embedder reads them, or if it reads none: a client started with a plain
//! `spawn` is not blind.
//!
//! Every event has the target `ticketing`. Levels: `error` for a client
//! that every server refused (misconfigured); `warn` for a connection or
//! attempt that failed (with its I/O error), a credential or version
//! refused, an ignored hint, and a lease in jeopardy, lost or expired;
//! `info` for a connection made, a redirect, a leader hint and the end of
//! a shutdown; `debug` for the rest (connecting, backoff, renewals, orphan
//! releases).

use tracing::{debug, error, info, warn};

use crate::client::{CloseReason, Event};
use crate::runtime::error::ConnectError;

/// Emits `event` (`failure`: the attempt's end, with its I/O error, for a
/// `Closed` notice).
pub(crate) fn notice(event: &Event, failure: Option<&ConnectError>) {
    const T: &str = "ticketing";
    match event {
        Event::Connecting { addr } => debug!(target: T, %addr, "connecting"),
        Event::Connected { addr, node, window } => {
            info!(target: T, %addr, %node, window, "connected")
        }
        Event::Closed { addr, reason } => match reason {
            CloseReason::Shutdown | CloseReason::Cancel => {
                debug!(target: T, %addr, %reason, "connection closed")
            }
            CloseReason::Moved | CloseReason::NoLeader | CloseReason::NotActive => {
                info!(target: T, %addr, %reason, "connection closed")
            }
            _ => match failure.and_then(ConnectError::io_error) {
                Some(io) => warn!(target: T, %addr, %reason, error = %io, "connection failed"),
                None => warn!(target: T, %addr, %reason, "connection failed"),
            },
        },
        Event::LeaderHint { addr } => info!(target: T, %addr, "leader hint taken"),
        Event::HintIgnored { addr } => {
            warn!(target: T, %addr, "leader hint outside the allowlist ignored")
        }
        Event::AuthFailed { addr } => warn!(target: T, %addr, "credential refused (auth_failed)"),
        Event::UnsupportedVersion { addr } => {
            warn!(target: T, %addr, "protocol version refused (unsupported_version)")
        }
        Event::Misconfigured { cause } => error!(
            target: T,
            %cause,
            "every server refused this client: acquires are refused until one accepts it"
        ),
        Event::Renewed { key, token, .. } => debug!(target: T, %key, token, "lease renewed"),
        Event::LeaseJeopardy { key, token, .. } => warn!(
            target: T,
            %key,
            token,
            "lease in jeopardy: renewals go unanswered"
        ),
        Event::LeaseLost { key, token, .. } => warn!(target: T, %key, token, "lease lost"),
        Event::LeaseExpired { key, token, .. } => warn!(target: T, %key, token, "lease expired"),
        Event::Backoff { cause, until } => {
            debug!(target: T, cause = ?cause, until = %until, "backing off")
        }
        Event::OrphanRelease { key, token } => {
            debug!(target: T, %key, token, "releasing a grant nobody took")
        }
        Event::OrphanSettled { key, token, result } => {
            debug!(target: T, %key, token, result = ?result, "orphan release settled")
        }
        Event::ShutdownComplete => info!(target: T, "shut down"),
        // Outcomes go to their callers, not here.
        _ => {}
    }
}
