//! Sandgate's data plane: the explicit proxy (CONNECT and absolute-form HTTP), the transparent
//! listener for nftables-redirected connections, SNI relays, name resolution, vetted dialling,
//! spliced tunnels, metrics, the connection log, the admin endpoints and policy reload.
//!
//! [`start`] binds every listener first (so a bad address fails before anything serves), then
//! serves until [`RunningProxy::drain`].

mod admin;
mod config;
mod connect;
mod dns;
mod error;
mod explicit;
pub mod identity;
pub mod intercept;
pub mod log;
mod metrics;
mod reload;
mod resolve;
mod shared;
pub mod sni;
mod transparent;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sandgate_policy::CompiledPolicy;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use config::{Limits, ProxyConfig, default_workers};
pub use error::{ProxyError, Side};
pub use intercept::Interceptor;
pub use metrics::ProxyMetrics;
pub use reload::{LoadError, load_policy};

use crate::log::Listener;
use crate::shared::Shared;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}; pick another address or free the port")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which listener.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The resolver could not be set up.
    #[error("DNS resolver: {0}; pass --dns-server ADDR")]
    Resolver(String),
    /// Metrics could not be registered (a bug).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Worker(String),
    /// No listener was configured.
    #[error("no listener configured; give at least one of --listen, --transparent or --sni-relay")]
    NoListener,
}

/// A started proxy: its bound addresses, and the handle to stop it.
#[derive(Debug)]
pub struct RunningProxy {
    /// The explicit listener's address.
    pub explicit: Option<SocketAddr>,
    /// The transparent listener's address.
    pub transparent: Option<SocketAddr>,
    /// The SNI relays' addresses.
    pub sni_relays: Vec<SocketAddr>,
    /// The admin listener's address.
    pub admin: Option<SocketAddr>,
    /// The DNS responder's address.
    pub dns: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

/// Binds every configured listener and starts serving with `policy`.
///
/// Connections are served by `config.workers` threads, each running its own single-threaded
/// runtime with its own `SO_REUSEPORT` copy of every listener: the kernel spreads connections
/// across them and a connection never changes thread, so there are no cross-thread wake-ups
/// on the hot path (the nginx model). The admin listener and the policy watcher run on the
/// caller's runtime.
pub async fn start(config: ProxyConfig, policy: CompiledPolicy) -> Result<RunningProxy, StartError> {
    if config.explicit.is_none() && config.transparent.is_none() && config.sni_relays.is_empty() {
        return Err(StartError::NoListener);
    }
    let workers = config.workers.max(1);
    // Every worker gets a copy of each listener; the first copy fixes the port when 0 was asked.
    let mut kinds: Vec<(SocketAddr, &'static str, Listener, Option<u16>)> = Vec::new();
    if let Some(a) = config.explicit {
        kinds.push((a, "explicit proxy", Listener::Explicit, None));
    }
    if let Some(a) = config.transparent {
        kinds.push((a, "transparent", Listener::Transparent, None));
    }
    for (a, port) in &config.sni_relays {
        kinds.push((*a, "SNI relay", Listener::Sni, Some(*port)));
    }
    let mut per_worker: Vec<Vec<(std::net::TcpListener, Listener, Option<u16>)>> =
        (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::with_capacity(kinds.len());
    for (addr, what, kind, port) in kinds {
        let mut actual = addr;
        for listeners in &mut per_worker {
            let l = listen(actual, true).map_err(|source| StartError::Bind { addr, what, source })?;
            actual = l.local_addr().map_err(|source| StartError::Bind { addr, what, source })?;
            listeners.push((l, kind, port));
        }
        bound.push((kind, actual));
    }
    let dns = match config.dns {
        Some(addr) => {
            let s = std::net::UdpSocket::bind(addr)
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .and_then(tokio::net::UdpSocket::from_std)
                .map_err(|source| StartError::Bind { addr, what: "DNS", source })?;
            Some(s)
        }
        None => None,
    };
    let admin = match config.admin {
        Some(addr) => {
            let l = listen(addr, false).map_err(|source| StartError::Bind { addr, what: "admin", source })?;
            Some(TcpListener::from_std(l).map_err(|source| StartError::Bind { addr, what: "admin", source })?)
        }
        None => None,
    };
    let resolver = resolve::Resolver::new(&config.dns_servers).map_err(StartError::Resolver)?;
    let metrics = match config.metrics.clone() {
        Some(m) => m,
        None => ProxyMetrics::new()?,
    };
    let (policy_tx, policy_rx) = watch::channel(Arc::new(policy));
    let mut shared = Shared::new(
        policy_rx,
        resolver,
        metrics.clone(),
        config.limits.clone(),
        config.interceptor.clone(),
        config.sandbox.clone(),
        config.profile.clone(),
    );
    shared.identities.clone_from(&config.identities);
    let shared = Arc::new(shared);
    let (stop, stop_rx) = watch::channel(false);
    let find = |k: Listener| bound.iter().find(|(kind, _)| *kind == k).map(|(_, a)| *a);
    let mut running = RunningProxy {
        explicit: find(Listener::Explicit),
        transparent: find(Listener::Transparent),
        sni_relays: bound.iter().filter(|(k, _)| *k == Listener::Sni).map(|(_, a)| *a).collect(),
        admin: admin.as_ref().and_then(|l| l.local_addr().ok()),
        dns: dns.as_ref().and_then(|s| s.local_addr().ok()),
        shared: shared.clone(),
        stop,
        tasks: JoinSet::new(),
    };
    for (i, listeners) in per_worker.into_iter().enumerate() {
        let (shared, stop) = (shared.clone(), stop_rx.clone());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("sandgate-worker-{i}"))
            .spawn(move || worker(listeners, shared, stop, done_tx))
            .map_err(|e| StartError::Worker(e.to_string()))?;
        running.tasks.spawn(async move {
            let _ = done_rx.await;
        });
    }
    if let Some(l) = admin {
        running.tasks.spawn(admin::serve(l, shared.clone(), stop_rx.clone()));
    }
    if let Some(s) = dns {
        running.tasks.spawn(dns::serve(s, shared.clone(), stop_rx.clone()));
    }
    // The watcher runs detached: it ends when every policy receiver (the shared state) is gone.
    tokio::spawn(reload::watch_policy(config.policy_path.clone(), policy_tx, metrics, config.policy_poll));
    Ok(running)
}

/// One worker thread: a single-threaded runtime serving its copies of the listeners until
/// told to stop, then its live connections until they end (or the process exits).
fn worker(
    listeners: Vec<(std::net::TcpListener, Listener, Option<u16>)>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    done: tokio::sync::oneshot::Sender<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start a worker runtime: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let mut accepting = JoinSet::new();
        for (l, kind, port) in listeners {
            match TcpListener::from_std(l) {
                Ok(l) => {
                    accepting.spawn(accept_loop(l, shared.clone(), kind, port, stop.clone()));
                }
                Err(e) => tracing::error!(listener = kind.as_str(), "cannot register a listener: {e}"),
            }
        }
        while accepting.join_next().await.is_some() {}
        let _ = done.send(());
        // Keep serving this worker's live connections while the process drains.
        std::future::pending::<()>().await;
    });
}

impl RunningProxy {
    /// The proxy's metrics.
    pub fn metrics(&self) -> &ProxyMetrics {
        &self.shared.metrics
    }

    /// Client connections open now.
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Stops accepting, then waits for live connections to end, at most the drain timeout.
    /// Returns the number of connections still open when it gave up.
    pub async fn drain(mut self) -> usize {
        self.shared.draining.store(true, Ordering::Release);
        let _ = self.stop.send(true);
        while self.tasks.join_next().await.is_some() {}
        let deadline = tokio::time::Instant::now() + self.shared.limits.drain_timeout;
        loop {
            let notified = self.shared.idle.notified();
            let open = self.shared.active.load(Ordering::Acquire);
            if open == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.shared.active.load(Ordering::Acquire);
            }
        }
    }
}

/// Pending connections the kernel may queue per listener (capped by `net.core.somaxconn`):
/// a burst of thousands of connects must not overflow into SYN retransmits, which cost a
/// client whole seconds.
const LISTEN_BACKLOG: i32 = 4096;

/// Binds a listener with `SO_REUSEADDR` (restarts do not wait for TIME_WAIT), a deep backlog,
/// and `SO_REUSEPORT` when each worker gets its own copy.
fn listen(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    // Accepted sockets inherit TCP_NODELAY from the listener: one setsockopt per listener
    // instead of one per connection. Small writes (handshakes, heads) must not wait for Nagle.
    socket.set_tcp_nodelay(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    kind: Listener,
    relay_port: Option<u16>,
    mut stop: watch::Receiver<bool>,
) {
    let gauge = shared.metrics.active.with_label_values(&[kind.as_str()]);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors or similar: back off instead of spinning.
                    tracing::warn!(listener = kind.as_str(), "accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        // IPv4 clients of a dual-stack listener arrive v4-mapped; policies name them as IPv4.
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        let guard = match shared.admit(peer.ip(), &gauge) {
            Ok(g) => g,
            Err(e) => {
                reject(&shared, stream, peer, kind, &e);
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            match kind {
                Listener::Explicit => explicit::serve(shared, stream, peer, guard).await,
                Listener::Transparent | Listener::Sni => {
                    transparent::serve(shared, stream, peer, kind, relay_port, guard).await;
                }
                // The DNS responder has no TCP listener of its own.
                Listener::Dns => drop(guard),
            }
        });
    }
}

/// Turns away a connection over a limit: explicit clients get a 503 they can read.
fn reject(shared: &Shared, stream: TcpStream, peer: SocketAddr, kind: Listener, e: &ProxyError) {
    if kind == Listener::Explicit {
        let msg = shared::raw_response("503 Service Unavailable", e.as_label(), &format!("sandgate: {e}\n"));
        let _ = stream.try_write(msg.as_bytes());
    }
    let policy = shared.policy();
    let mut rec = shared.record(kind, peer);
    rec.fail(e);
    rec.finish(&policy, &shared.metrics);
}
