//! The server's TLS listener, on tokio-rustls.
//!
//! A connection's handshake runs in the server task, as part of reading
//! and writing the connection ([`TlsServerStream`]): the core hears of the
//! connection when it is accepted, so its handshake timeout bounds the TLS
//! handshake too, and a client that never finishes one (or speaks plain
//! TCP) is closed like one that never sends `H`. Nothing the client sends
//! reaches the core before the handshake is done: a client the server's
//! TLS refuses (one without a certificate its client CA signed, say) is
//! refused before its `H`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{Accept, TlsAcceptor};

use super::ServerTls;
use crate::adapters::serve::Listener;

/// Accepts connections from another listener (TCP unless told otherwise)
/// and speaks TLS on them.
///
/// ```no_run
/// # async fn demo(core: ticketing::server::Server) -> Result<(), Box<dyn std::error::Error>> {
/// use ticketing::serve::{spawn, TlsListener};
/// use ticketing::tls::{Identity, ServerTls};
///
/// let tls = ServerTls::builder()
///     .identity(Identity::from_pem_files("server.pem", "server.key")?)
///     .client_ca_file("clients-ca.pem")? // only for mutual TLS
///     .build()?;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:7878").await?;
/// let server = spawn(TlsListener::new(listener, tls), core)?;
/// # Ok(()) }
/// ```
pub struct TlsListener<L = TcpListener> {
    inner: L,
    acceptor: TlsAcceptor,
}

impl<L> std::fmt::Debug for TlsListener<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener").finish_non_exhaustive()
    }
}

impl<L: Listener> TlsListener<L> {
    /// TLS on the connections of `inner`.
    pub fn new(inner: L, tls: ServerTls) -> TlsListener<L> {
        TlsListener {
            inner,
            acceptor: TlsAcceptor::from(tls.config),
        }
    }
}

impl<L: Listener> Listener for TlsListener<L> {
    type Stream = TlsServerStream<L::Stream>;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Stream>> {
        self.inner.poll_accept(cx).map_ok(|stream| TlsServerStream {
            state: State::Handshaking(self.acceptor.accept(stream)),
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection of a [`TlsListener`]: its handshake runs as it is read.
pub struct TlsServerStream<S> {
    state: State<S>,
}

impl<S> std::fmt::Debug for TlsServerStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Handshaking(_) => "handshaking",
            State::Ready(_) => "ready",
            State::Failed => "failed",
        };
        f.debug_struct("TlsServerStream")
            .field("state", &state)
            .finish()
    }
}

enum State<S> {
    Handshaking(Accept<S>),
    Ready(TlsStream<S>),
    /// The handshake failed; its alert, if any, was sent.
    Failed,
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsServerStream<S> {
    /// Takes the handshake as far as it goes: `Ready(Ok)` once it is done.
    fn poll_handshake(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Handshaking(accept) => match Pin::new(accept).poll(cx) {
                Poll::Ready(Ok(stream)) => {
                    self.state = State::Ready(stream);
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => {
                    self.state = State::Failed;
                    Poll::Ready(Err(e))
                }
                Poll::Pending => Poll::Pending,
            },
            State::Ready(_) => Poll::Ready(Ok(())),
            State::Failed => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
        }
    }

    fn ready(&mut self) -> Pin<&mut TlsStream<S>> {
        match &mut self.state {
            State::Ready(stream) => Pin::new(stream),
            _ => unreachable!("called once the handshake is done"),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsServerStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        this.ready().poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsServerStream<S> {
    /// What the core says before the handshake is done (an `L` to every
    /// connection, say) waits for it: the handshake goes on as it is
    /// written, and the last words to a peer that never finishes one are
    /// given up like those to a peer that does not read them.
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_handshake(cx))?;
        this.ready().poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            State::Ready(stream) => Pin::new(stream).poll_flush(cx),
            State::Handshaking(_) | State::Failed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().state {
            // Sends close_notify first.
            State::Ready(stream) => Pin::new(stream).poll_shutdown(cx),
            State::Handshaking(_) | State::Failed => Poll::Ready(Ok(())),
        }
    }
}
