//! The blocking adapter's TLS connector, on rustls's own
//! [`ClientConnection`].
//!
//! The blocking adapter reads a connection on one thread and writes it on
//! another, each with its own handle on the stream ([`BlockingStream`]).
//! rustls's `StreamOwned` cannot be shared that way (reading and writing
//! both change the one session), so [`TlsStream`] shares the session behind
//! a lock that no thread holds while it blocks on the socket:
//!
//! - the reader reads ciphertext from the socket without the lock, then
//!   takes it to decrypt;
//! - the writer takes it to encrypt, then writes the records without it;
//! - records go out in the order the session made them: whoever writes them
//!   holds a second lock, the *sending* one, from taking them out of the
//!   session until they are on the socket. The reader, whose processing
//!   may make records of its own (an alert, a key update's answer), never
//!   waits for it: if the writer holds it, the writer sends them too, after
//!   its own, so the reader is never held up by a writer blocked on a peer
//!   that does not read.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread;
use std::time::{Duration, Instant};

use rustls::ClientConnection;

use super::handshake_error;
use crate::names::Endpoint;
use crate::runtime::blocking::{BlockingStream, Connector, TcpConnector};
use crate::sync::lock;
use crate::tls::{ClientTls, TlsFailure};

tls_connector! {
    /// Connects through another connector (TCP unless told otherwise), then
    /// runs a TLS handshake over it on the connecting thread, bounded by
    /// [`ClientTls::handshake_timeout`] or by what is left of the connect
    /// timeout, whichever is shorter. A failed handshake ends the connect
    /// attempt with its [`TlsFailure`](crate::tls::TlsFailure), closed as
    /// `tls:<detail>`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ticketing::blocking::{connect, TlsConnector};
    /// use ticketing::client::Config;
    /// use ticketing::tls::ClientTls;
    /// use ticketing::{Endpoint, Name};
    ///
    /// let tls = ClientTls::builder().ca_file("ca.pem")?.build()?;
    /// let config = Config::new([Endpoint::new("locks.internal:7878")?], Name::new("cron-7")?);
    /// let client = connect(config, TlsConnector::new(tls))?;
    /// # Ok(()) }
    /// ```
}

impl<C: Connector> Connector for TlsConnector<C> {
    type Stream = TlsStream<C::Stream>;

    fn is_tls(&self) -> bool {
        true
    }

    fn connect(&self, addr: &Endpoint, timeout: Duration) -> io::Result<Self::Stream> {
        let started = Instant::now();
        let name = self.tls.server_name_for(addr)?;
        let mut stream = self.inner.connect(addr, timeout)?;
        let mut session = ClientConnection::new(Arc::clone(&self.tls.config), name)
            .map_err(|e| handshake_error(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        let budget = self
            .tls
            .handshake_timeout
            .min(timeout.saturating_sub(started.elapsed()));
        handshake(&mut session, &mut stream, budget)?;
        Ok(TlsStream {
            shared: Arc::new(Shared {
                session: Mutex::new(session),
                sending: Mutex::new(Vec::new()),
            }),
            raw: stream,
            incoming: Vec::new(),
            start: 0,
            end: 0,
        })
    }
}

/// Runs the handshake of `session` over `stream` within `budget`: past it,
/// a watchdog shuts the stream down, which ends the blocked read or write.
fn handshake<S: BlockingStream>(
    session: &mut ClientConnection,
    stream: &mut S,
    budget: Duration,
) -> io::Result<()> {
    let guard = stream.try_clone()?;
    let fired = Arc::new(AtomicBool::new(false));
    let (done, wait) = mpsc::channel::<()>();
    let watchdog = thread::Builder::new()
        .name("ticketing-tls-watchdog".into())
        .spawn({
            let fired = Arc::clone(&fired);
            move || {
                if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(budget) {
                    fired.store(true, Ordering::Release);
                    let _ = guard.shutdown();
                }
            }
        })?;
    let result = session.complete_io(stream).and_then(|_| {
        if session.is_handshaking() {
            // complete_io stops short of the end only at the stream's end.
            Err(io::ErrorKind::UnexpectedEof.into())
        } else {
            Ok(())
        }
    });
    drop(done);
    let _ = watchdog.join();
    if fired.load(Ordering::Acquire) {
        // Even if the handshake ended just then: the stream is shut down.
        return Err(TlsFailure::HandshakeTimeout.into());
    }
    result.map_err(handshake_error)
}

/// Locks a mutex whose holders never leave its data half-changed.
/// What the handles on one TLS connection share.
struct Shared {
    session: Mutex<ClientConnection>,
    /// Held from taking records out of the session until they are written:
    /// they go out in order. The records being written.
    sending: Mutex<Vec<u8>>,
}

impl Shared {
    /// Writes the records the session has made to `raw`. With `wait`, waits
    /// for another handle that is writing; without, leaves them to it.
    /// Never called with the session locked.
    fn send(&self, raw: &mut impl Write, wait: bool) -> io::Result<()> {
        let mut wait = wait;
        loop {
            let mut out = if wait {
                lock(&self.sending)
            } else {
                match self.sending.try_lock() {
                    Ok(out) => out,
                    Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                    // The holder sends what is there once it is done.
                    Err(TryLockError::WouldBlock) => return Ok(()),
                }
            };
            loop {
                out.clear();
                {
                    let mut session = lock(&self.session);
                    while session.wants_write() {
                        session.write_tls(&mut *out)?;
                    }
                }
                if out.is_empty() {
                    break;
                }
                raw.write_all(&out)?;
                raw.flush()?;
            }
            drop(out);
            // Records another handle made while this one held the lock, and
            // left to it.
            if !lock(&self.session).wants_write() {
                return Ok(());
            }
            wait = false;
        }
    }
}

/// A TLS connection of the blocking adapter: one handle per thread (see
/// [`BlockingStream::try_clone`]), all on one session.
pub struct TlsStream<S> {
    shared: Arc<Shared>,
    raw: S,
    /// Ciphertext read from the socket, `start..end` not yet taken by the
    /// session.
    incoming: Vec<u8>,
    start: usize,
    end: usize,
}

impl<S> std::fmt::Debug for TlsStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream").finish_non_exhaustive()
    }
}

/// How much ciphertext one read of the socket takes at most.
const READ_SIZE: usize = 16 * 1024;

impl<S: BlockingStream> Read for TlsStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let wants_write = {
                let mut session = lock(&self.shared.session);
                loop {
                    match session.reader().read(buf) {
                        // 0: the peer closed the session cleanly.
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if self.start == self.end {
                        break;
                    }
                    self.start += session.read_tls(&mut &self.incoming[self.start..self.end])?;
                    if let Err(e) = session.process_new_packets() {
                        drop(session);
                        // Its alert, if it has one, goes out.
                        let _ = self.shared.send(&mut self.raw, false);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                }
                session.wants_write()
            };
            if wants_write {
                self.shared.send(&mut self.raw, false)?;
            }
            if self.incoming.is_empty() {
                self.incoming.resize(READ_SIZE, 0);
            }
            let n = loop {
                match self.raw.read(&mut self.incoming) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            (self.start, self.end) = (0, n);
            if n == 0 {
                // The end of the stream: the session says whether it was a
                // clean one (a close_notify came first) or a truncation.
                lock(&self.shared.session).read_tls(&mut io::empty())?;
            }
        }
    }
}

impl<S: BlockingStream> Write for TlsStream<S> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = lock(&self.shared.session).writer().write(data)?;
        self.shared.send(&mut self.raw, true)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.send(&mut self.raw, true)
    }
}

impl<S: BlockingStream> BlockingStream for TlsStream<S> {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(TlsStream {
            shared: Arc::clone(&self.shared),
            raw: self.raw.try_clone()?,
            incoming: Vec::new(),
            start: 0,
            end: 0,
        })
    }

    fn shutdown(&self) -> io::Result<()> {
        self.raw.shutdown()
    }
}
