//! A freezable TCP proxy: the network between a service and its upstream, under a test's
//! control.

use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forwarding,
    Frozen,
    Cut,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// How many times [`Proxy::cut`] was called. A connection closes when this passes the
    /// value it saw when it was accepted, so a `cut()` followed at once by `thaw()` still
    /// closes every connection, even one whose task did not run in between.
    cuts: u64,
}

/// A TCP proxy on `127.0.0.1:0` that forwards every connection to one upstream address, and
/// that a test can freeze, thaw and cut.
///
/// - [`freeze`](Self::freeze): a network partition. No byte is forwarded in either direction,
///   no connection is closed or reset, and new connections are accepted but not forwarded;
///   a client sees silence, as when packets are dropped.
/// - [`thaw`](Self::thaw): forwarding resumes, starting with everything held back.
/// - [`cut`](Self::cut): every current connection is closed; until the next `thaw`, new
///   connections are accepted and closed at once.
/// - Dropping the proxy stops it and closes every connection.
///
/// The proxy runs on its own thread with its own runtime, so it keeps forwarding whichever
/// runtime the test uses and even while the test blocks a thread.
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: watch::Sender<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream`, forwarding. Panics if it cannot bind a local port.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("proxy: binding a local port");
        listener
            .set_nonblocking(true)
            .expect("proxy: non-blocking listener");
        let addr = listener.local_addr().expect("proxy: local address");
        let (state, watcher) = watch::channel(State {
            mode: Mode::Forwarding,
            cuts: 0,
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("testkit-proxy-{}", addr.port()))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy: runtime");
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener).expect("proxy: listener");
                    tokio::select! {
                        _ = stopped => {}
                        () = accept_loop(listener, upstream, watcher) => {}
                    }
                });
                // Dropping the runtime drops every relay task, and with them every socket.
            })
            .expect("proxy: spawning its thread");
        Self {
            addr,
            upstream,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The address clients connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Stops forwarding bytes in both directions, keeping every connection open. Bytes
    /// already read from a socket when this is called may still be delivered; everything
    /// after is held back until [`thaw`](Self::thaw).
    pub fn freeze(&self) {
        self.state.send_modify(|s| s.mode = Mode::Frozen);
    }

    /// Resumes forwarding (after a freeze or a cut), first of all what was held back.
    pub fn thaw(&self) {
        self.state.send_modify(|s| s.mode = Mode::Forwarding);
    }

    /// Closes every current connection; new ones are closed on arrival until
    /// [`thaw`](Self::thaw).
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.mode = Mode::Cut;
            s.cuts += 1;
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("mode", &self.state.borrow().mode)
            .finish()
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: watch::Receiver<State>) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                tokio::spawn(relay(client, upstream, state.clone()));
            }
            // Out of file handles or a connection reset before accept: try again shortly
            // rather than spin.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

/// Carries one connection until either side closes it, the proxy cuts it, or the proxy stops.
async fn relay(client: TcpStream, upstream: SocketAddr, mut state: watch::Receiver<State>) {
    let seen = *state.borrow_and_update();
    if seen.mode == Mode::Cut {
        return;
    }
    let mut cuts = state.clone();
    let cut = async move {
        // Also ends when the proxy is gone.
        let _ = cuts.wait_for(|s| s.cuts > seen.cuts).await;
    };
    let work = async move {
        // A frozen proxy holds a new connection before it reaches the upstream: to the
        // client, the connection is open and silent.
        forwarding(&mut state).await?;
        let upstream = TcpStream::connect(upstream).await?;
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (client_read, client_write) = client.into_split();
        let (upstream_read, upstream_write) = upstream.into_split();
        tokio::try_join!(
            pump(client_read, upstream_write, state.clone()),
            pump(upstream_read, client_write, state),
        )?;
        io::Result::Ok(())
    };
    // Whichever ends first, both sockets are dropped, that is closed, here.
    tokio::select! {
        () = cut => {}
        _ = work => {}
    }
}

/// Copies one direction, holding bytes (and end of stream) while the proxy is frozen.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
) -> io::Result<()> {
    let mut buf = vec![0; 16 * 1024];
    loop {
        forwarding(&mut state).await?;
        let n = from.read(&mut buf).await?;
        // Bytes that arrived while frozen wait here until the thaw.
        forwarding(&mut state).await?;
        if n == 0 {
            // Half-close: the other direction goes on until its side closes too.
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// Waits while the proxy is frozen; an error once it is cut or gone.
async fn forwarding(state: &mut watch::Receiver<State>) -> io::Result<()> {
    let mode = state
        .wait_for(|s| s.mode != Mode::Frozen)
        .await
        .map(|s| s.mode);
    match mode {
        Ok(Mode::Forwarding) => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "cut by the proxy",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Long enough for a forwarded echo on a loaded machine.
    const PATIENCE: Duration = Duration::from_secs(5);
    /// How long silence must last to count as "nothing arrives".
    const SILENCE: Duration = Duration::from_millis(300);

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        addr
    }

    async fn send(socket: &mut TcpStream, text: &str) {
        socket.write_all(text.as_bytes()).await.unwrap();
    }

    async fn receive(socket: &mut TcpStream, len: usize) -> String {
        let mut buf = vec![0; len];
        tokio::time::timeout(PATIENCE, socket.read_exact(&mut buf))
            .await
            .expect("no answer within patience")
            .expect("read");
        String::from_utf8(buf).unwrap()
    }

    /// A proxy in front of an echo server, and a connection through it that has carried a
    /// first echo.
    async fn proxied_echo() -> (Proxy, TcpStream) {
        let proxy = Proxy::start(echo_server().await);
        let mut socket = connect(&proxy).await;
        assert_echoed(&mut socket, "ping").await;
        (proxy, socket)
    }

    async fn connect(proxy: &Proxy) -> TcpStream {
        TcpStream::connect(proxy.addr()).await.unwrap()
    }

    /// Sends `text` and asserts that the same text comes back through the proxy.
    async fn assert_echoed(socket: &mut TcpStream, text: &str) {
        send(socket, text).await;
        assert_eq!(receive(socket, text.len()).await, text);
    }

    async fn assert_silent(socket: &mut TcpStream) {
        let mut buf = [0; 16];
        let read = tokio::time::timeout(SILENCE, socket.read(&mut buf)).await;
        assert!(read.is_err(), "expected silence, got {read:?}");
    }

    async fn assert_closed(socket: &mut TcpStream) {
        let mut buf = [0; 16];
        let read = tokio::time::timeout(PATIENCE, socket.read(&mut buf))
            .await
            .expect("connection still open");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "expected close, got {read:?}"
        );
    }

    #[tokio::test]
    async fn freeze_holds_bytes_thaw_delivers_them_and_cut_closes() {
        let (proxy, mut first) = proxied_echo().await;

        // Frozen: nothing arrives, nothing is closed; a new connection is held silent.
        proxy.freeze();
        send(&mut first, "held").await;
        assert_silent(&mut first).await;
        let mut second = connect(&proxy).await;
        send(&mut second, "late").await;
        assert_silent(&mut second).await;

        // Thawed: what was held back arrives, and both connections carry on.
        proxy.thaw();
        assert_eq!(receive(&mut first, 4).await, "held");
        assert_eq!(receive(&mut second, 4).await, "late");
        assert_echoed(&mut second, "more").await;

        // Cut: current connections close, and new ones are closed on arrival.
        proxy.cut();
        assert_closed(&mut first).await;
        assert_closed(&mut second).await;
        let mut refused = connect(&proxy).await;
        assert_closed(&mut refused).await;

        // Thawed after a cut: new connections are forwarded again.
        proxy.thaw();
        let mut third = connect(&proxy).await;
        assert_echoed(&mut third, "back").await;

        // Dropped: the proxy's connections close with it.
        drop(proxy);
        assert_closed(&mut third).await;
    }

    #[tokio::test]
    async fn a_cut_followed_at_once_by_a_thaw_still_closes_connections() {
        let (proxy, mut socket) = proxied_echo().await;
        proxy.cut();
        proxy.thaw();
        assert_closed(&mut socket).await;
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], crate::closed_port())));
        let mut socket = connect(&proxy).await;
        assert_closed(&mut socket).await;
    }
}
