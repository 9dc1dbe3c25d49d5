//! The network between the lease servers and PostgreSQL, as a TCP proxy the run can cut.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// A proxy on `127.0.0.1:0` to one upstream address. [`cut`](Self::cut) closes every
/// connection and refuses new ones until [`restore`](Self::restore). It runs on a thread of
/// its own, so the run's own load never delays it.
pub struct CutProxy {
    addr: SocketAddr,
    /// How many cuts so far, and whether the last one still holds.
    state: watch::Sender<(u64, bool)>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl CutProxy {
    pub fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("proxy: binding a local port")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (state, watcher) = watch::channel((0, false));
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("proxy: runtime")?;
        let thread = std::thread::Builder::new()
            .name("chaos-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = stopped => {}
                        () = accept(listener, upstream, watcher) => {}
                    }
                });
            })
            .context("proxy: spawning its thread")?;
        Ok(Self {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn cut(&self) {
        self.state.send_modify(|(cuts, down)| {
            *cuts += 1;
            *down = true;
        });
    }

    pub fn restore(&self) {
        self.state.send_modify(|(_, down)| *down = false);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, state: watch::Receiver<(u64, bool)>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let (cuts, down) = *state.borrow();
        if down {
            continue; // dropped: closed at once
        }
        let mut state = state.clone();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            let mut client = client;
            // Ends on either side closing, or on the next cut, which drops both sockets.
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = state.wait_for(|(now, _)| *now != cuts) => {}
            }
        });
    }
}
