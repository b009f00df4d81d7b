//! Options and configuration shared by the subcommands that run a client.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args as ClapArgs, ValueEnum};
use ticketing::client::{BusyPolicy, CancelPolicy, Config};
use ticketing::{Endpoint, Name};

#[derive(Clone, Copy, ValueEnum)]
pub enum BusyArg {
    Retry,
    FailFast,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CancelArg {
    Close,
    KeepWaiter,
}

/// How to reach the service, and the client core's settings.
#[derive(ClapArgs)]
pub struct ClientOptions {
    /// A server address (host:port); repeat for several.
    #[arg(long = "endpoint", value_name = "ADDR", required = true)]
    pub endpoints: Vec<Endpoint>,
    /// An extra address a leader hint may name; repeat for several.
    #[arg(long = "allow", value_name = "ADDR")]
    pub allow: Vec<Endpoint>,
    /// Sent in the handshake.
    #[arg(long, value_name = "ID", default_value = "ticketing-cli")]
    pub client_id: Name,
    /// Sent in the handshake.
    #[arg(long, value_name = "C")]
    pub credential: Option<Name>,
    /// Window slots kept for releases.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub reserved: u32,
    /// What a B answer does.
    #[arg(long, value_enum, default_value = "retry")]
    pub busy: BusyArg,
    /// What cancelling a sent acquire does.
    #[arg(long = "on-cancel", value_enum, default_value = "close")]
    pub on_cancel: CancelArg,
    /// How late an answer may be before the connection is deemed unwell.
    #[arg(long, value_name = "N")]
    pub answer_grace_ms: Option<u64>,
    /// How long an unsent acquire waits for a connection at least.
    #[arg(long, value_name = "N")]
    pub queue_grace_ms: Option<u64>,
    /// Seed of the backoff jitter (default: from the clock and process id).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

/// The client core's configuration from the options.
pub fn client_config(o: &ClientOptions) -> Result<Config, Box<dyn std::error::Error>> {
    let mut config = Config::new(o.endpoints.iter().cloned(), o.client_id.clone());
    config.allow = o.allow.clone();
    config.credential = o.credential.clone();
    config.reserved = o.reserved;
    config.busy = match o.busy {
        BusyArg::Retry => BusyPolicy::Retry,
        BusyArg::FailFast => BusyPolicy::FailFast,
    };
    config.cancel = match o.on_cancel {
        CancelArg::Close => CancelPolicy::Close,
        CancelArg::KeepWaiter => CancelPolicy::KeepWaiter,
    };
    if let Some(ms) = o.answer_grace_ms {
        config.answer_grace = Duration::from_millis(ms);
    }
    if let Some(ms) = o.queue_grace_ms {
        config.queue_grace = Duration::from_millis(ms);
    }
    // The core takes its randomness from the seed; the binary may pick one
    // from the clock so that two processes do not back off in lockstep.
    config.seed = o.seed.unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    Ok(config)
}
