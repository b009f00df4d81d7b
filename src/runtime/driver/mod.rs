//! The async driver shared by the tokio and futures-io adapters: one future
//! that owns the client core and its connection, and the cloneable
//! [`Handle`] that tasks use to reach it.
//!
//! The driver is written against two small traits, [`Transport`] (read and
//! write bytes) and [`Clock`] (wake me at an instant; run a driver on a
//! thread of its own), so that each runtime adapter is only the glue
//! between those traits and its runtime.
//!
//! Requests reach the driver through one queue behind a lock (the
//! [`Inbox`]), which the driver swaps for an empty one: a request allocates
//! nothing of its own, and a batch of them wakes the driver once. Each
//! request's answer comes back through a one-value slot shared by the
//! driver and the caller's future.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the traits a runtime adapter implements, and [`new`], which makes a handle and its driver |
//! | `handle.rs` | the embedder's side: the [`Handle`], the acquire and lock builders, the futures and the [`Lease`] guard |
//! | `inbox.rs` | the [`Inbox`] between the handles and the driver |
//! | `future.rs` | the [`Driver`] future: the loop over the core, the transport, the timers and the inbox |
//!
//! # When the runtime goes away
//!
//! A runtime that shuts down drops its tasks without polling them (that is
//! what happens when `#[tokio::main]` returns). A driver dropped so while
//! it still has work to finish (releases to send or to be answered, grants
//! held) moves to a thread of its own with a runtime of its own, over a new
//! connection, and goes on there as it would have: the core decides, as
//! ever. The drop waits, at most [`EXIT_FLUSH`], until no release is left;
//! a guard dropped later (by a task the runtime drops after the driver)
//! waits as long at most for its own release, and so does the last handle
//! for the client's end. A wait that runs out makes the later ones not
//! wait: a server that cannot be reached holds the program up once.
//!
//! [`EXIT_FLUSH`]: crate::runtime::shell::EXIT_FLUSH

mod future;
mod handle;
mod inbox;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use self::inbox::{Inbox, Sender};
use crate::client::{Client, Config, ConfigError};
use crate::names::Endpoint;
use crate::runtime::notices::Sink;
use crate::runtime::shell::Shell;
use crate::time::Time;

pub use self::future::Driver;
pub use self::handle::{Acquire, AcquireBuilder, Canceller, Handle, Lease, Lock, LockBuilder};

/// A connected byte stream, as the driver sees it.
pub(crate) trait Transport: Send + Unpin + 'static {
    fn poll_read(&mut self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>>;
    fn poll_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>>;
    /// Writes out what the stream holds of what it was given (a TLS
    /// stream's records).
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// The future of a driver that goes on on a thread of its own.
pub(crate) type Detached = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A timer of the runtime, and a runtime of the same kind on a thread of
/// its own.
pub(crate) trait Clock: Send + Unpin + 'static {
    fn new() -> Self;
    /// Ready once `at` has passed.
    fn poll_until(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()>;
    /// Has the task polled again once the other tasks that are ready have
    /// had their turn (at the latest).
    fn defer(&mut self, cx: &mut Context<'_>) {
        cx.waker().wake_by_ref();
    }
    /// Runs `driver` to its end on a new thread, with a runtime of its own:
    /// where a driver whose runtime went away finishes its work.
    fn run_detached(driver: Detached) -> io::Result<()>;
}

/// Opens transports.
pub(crate) trait Dial: Send + Sync + Unpin + 'static {
    type Transport: Transport;
    /// Whether its transports run TLS (the connector says).
    fn is_tls(&self) -> bool;
    fn dial(
        &self,
        addr: Endpoint,
    ) -> Pin<Box<dyn Future<Output = io::Result<Self::Transport>> + Send>>;
}

/// Makes a client core and the future that drives it. Nothing happens
/// until the future is polled (spawned on a runtime).
pub(crate) fn new<D: Dial, K: Clock>(
    config: Config,
    dial: D,
    notices: Sink,
) -> Result<(Handle, Driver<D, K>), ConfigError> {
    let start = Instant::now();
    let client = Client::new(config, Time::ZERO)?;
    let inbox = Inbox::new();
    let shell = Shell::new(client, start, notices).over_tls(dial.is_tls());
    let handle = Handle::new(Sender(Arc::clone(&inbox)), start, shell.conn_watch());
    Ok((handle, Driver::new(shell, inbox, dial, start)))
}
