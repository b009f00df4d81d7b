//! The reference server on tokio and TCP (feature `server`): the sans-IO
//! [`Server`] core behind a listener. This is what `ticketing serve` runs.
//!
//! One task owns the core and its timers; each connection has a task that
//! reads (with backpressure: it waits while the core is busy) and one that
//! writes. Every rule is the core's.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ::tokio::io::{AsyncReadExt, AsyncWriteExt};
use ::tokio::net::{TcpListener, TcpStream};
use ::tokio::sync::{mpsc, oneshot};
use ::tokio::task::JoinHandle;
use bytes::{Bytes, BytesMut};

use crate::names::Endpoint;
use crate::server::{Action, ConnId, LockTable, Role, Server};
use crate::time::Time;

/// A server running on a tokio task.
#[derive(Debug)]
pub struct ServerHandle {
    control: mpsc::UnboundedSender<Control>,
    addr: SocketAddr,
    origin: Instant,
    task: JoinHandle<Server>,
}

enum Control {
    TakeTable(oneshot::Sender<LockTable>),
    InstallTable(LockTable),
    Role(Role),
    Announce(Endpoint),
    DropConnections,
    Pause(bool),
    Stop,
}

impl ServerHandle {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes the node's role (a leader that stops leading tells every
    /// connection and closes it).
    pub fn set_role(&self, role: Role) {
        let _ = self.control.send(Control::Role(role));
    }

    /// The instant the server core's time counts from.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Takes the lock table out of the server (see
    /// [`Server::take_lock_table`]), e.g. to hand it to the next leader.
    /// Its times count from [`origin`](ServerHandle::origin): give the next
    /// server the same origin ([`spawn_with_origin`]).
    pub async fn take_lock_table(&self) -> io::Result<LockTable> {
        let (tx, rx) = oneshot::channel();
        let _ = self.control.send(Control::TakeTable(tx));
        rx.await
            .map_err(|_| io::Error::other("the server has stopped"))
    }

    /// Installs a lock table (see [`Server::install_lock_table`]).
    pub fn install_lock_table(&self, table: LockTable) {
        let _ = self.control.send(Control::InstallTable(table));
    }

    /// Sends `L addr` to every connection.
    pub fn announce_leader(&self, addr: Endpoint) {
        let _ = self.control.send(Control::Announce(addr));
    }

    /// Cuts every connection at once, as a network failure would; the
    /// server keeps running and its lock table is untouched.
    pub fn drop_connections(&self) {
        let _ = self.control.send(Control::DropConnections);
    }

    /// Stops taking bytes from connections (they queue, then TCP pushes
    /// back) until [`resume`](ServerHandle::resume): a server that hangs.
    /// Timers still run.
    pub fn pause(&self) {
        let _ = self.control.send(Control::Pause(true));
    }

    /// Takes bytes from connections again.
    pub fn resume(&self) {
        let _ = self.control.send(Control::Pause(false));
    }

    /// Stops accepting, closes every connection, and returns the core (its
    /// lock table can be carried into the next server).
    pub async fn stop(self) -> io::Result<Server> {
        let _ = self.control.send(Control::Stop);
        self.task.await.map_err(io::Error::other)
    }
}

/// Starts serving `server` on `listener`; the core's time counts from now.
pub fn spawn(listener: TcpListener, server: Server) -> io::Result<ServerHandle> {
    spawn_with_origin(listener, server, Instant::now())
}

/// Starts serving `server` on `listener`, its time counting from `origin`.
/// Servers that hand a lock table to each other must share an origin.
pub fn spawn_with_origin(
    listener: TcpListener,
    server: Server,
    origin: Instant,
) -> io::Result<ServerHandle> {
    let addr = listener.local_addr()?;
    let (control, rx) = mpsc::unbounded_channel();
    let task = ::tokio::spawn(run(listener, server, rx, origin));
    Ok(ServerHandle {
        control,
        addr,
        origin,
        task,
    })
}

/// Binds `addr` and serves `server` on it.
pub async fn bind(addr: &str, server: Server) -> io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr).await?;
    spawn(listener, server)
}

enum Report {
    Bytes(ConnId, Bytes),
    Closed(ConnId),
}

/// Reads queued for the core at most; a reader waits beyond that, so a
/// client that sends faster than the core answers is slowed by TCP, not
/// buffered here.
const QUEUED_READS: usize = 1024;

struct Conn {
    reader: JoinHandle<()>,
    writer: mpsc::UnboundedSender<Bytes>,
}

async fn run(
    listener: TcpListener,
    mut server: Server,
    mut control: mpsc::UnboundedReceiver<Control>,
    start: Instant,
) -> Server {
    let now =
        move || Time::from_nanos(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let (reports, mut incoming) = mpsc::channel(QUEUED_READS);
    let mut conns: HashMap<ConnId, Conn> = HashMap::new();
    let mut paused = false;
    // The core's timer. It is only ever moved earlier: a wake before the
    // core's deadline finds nothing due and costs one turn, whereas arming
    // a timer earlier than the runtime's next one makes tokio wake its
    // driver (a syscall), which would otherwise happen on every grant.
    let sleep = ::tokio::time::sleep_until(start.into());
    ::tokio::pin!(sleep);
    let mut armed: Option<Instant> = None;
    loop {
        while let Some(action) = server.poll_action() {
            match action {
                Action::Send { conn, data } => {
                    if let Some(c) = conns.get(&conn) {
                        let _ = c.writer.send(data);
                    }
                }
                Action::Close { conn } => {
                    if let Some(c) = conns.remove(&conn) {
                        // The writer writes what it has, then shuts down.
                        c.reader.abort();
                    }
                }
            }
        }
        let deadline = server
            .poll_timeout()
            .and_then(|at| start.checked_add(Duration::from_nanos(at.as_nanos())));
        if let Some(at) = deadline {
            if armed.map_or(true, |armed| at < armed) {
                sleep.as_mut().reset(at.into());
                armed = Some(at);
            }
        }
        ::tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let conn = server.handle_accept(now());
                    conns.insert(conn, attach(conn, stream, reports.clone()));
                }
            }
            Some(report) = incoming.recv(), if !paused => match report {
                Report::Bytes(conn, data) => server.handle_bytes(now(), conn, &data),
                Report::Closed(conn) => {
                    conns.remove(&conn);
                    server.handle_closed(now(), conn);
                }
            },
            command = control.recv() => match command {
                Some(Control::TakeTable(reply)) => {
                    let _ = reply.send(server.take_lock_table(now()));
                }
                Some(Control::InstallTable(table)) => server.install_lock_table(now(), table),
                Some(Control::Role(role)) => server.set_role(now(), role),
                Some(Control::Announce(addr)) => server.announce_leader(now(), addr),
                Some(Control::DropConnections) => {
                    for (conn, c) in conns.drain() {
                        c.reader.abort();
                        server.handle_closed(now(), conn);
                    }
                }
                Some(Control::Pause(on)) => paused = on,
                Some(Control::Stop) | None => break,
            },
            () = sleep.as_mut(), if armed.is_some() => {
                armed = None;
                server.handle_timeout(now());
            }
        }
    }
    for (conn, c) in conns.drain() {
        c.reader.abort();
        server.handle_closed(now(), conn);
    }
    while server.poll_action().is_some() {}
    server
}

/// Starts the reader and writer tasks of an accepted connection.
fn attach(conn: ConnId, stream: TcpStream, reports: mpsc::Sender<Report>) -> Conn {
    let _ = stream.set_nodelay(true);
    let (mut read, mut write) = stream.into_split();
    let reader_reports = reports.clone();
    let reader = ::tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(16 * 1024);
        loop {
            buf.reserve(4096);
            match read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let data = buf.split().freeze();
                    if reader_reports
                        .send(Report::Bytes(conn, data))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = reader_reports.send(Report::Closed(conn)).await;
    });
    let (writer, mut rx) = mpsc::unbounded_channel::<Bytes>();
    ::tokio::spawn(async move {
        while let Some(data) = rx.recv().await {
            if write.write_all(&data).await.is_err() {
                let _ = reports.send(Report::Closed(conn)).await;
                return;
            }
        }
        let _ = write.shutdown().await;
    });
    Conn { reader, writer }
}
