//! Process-independent proxy settings: listen addresses, limits and timeouts. The CLI fills it;
//! tests build it directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the proxy needs besides the policy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Explicit proxy listener (CONNECT and absolute-form HTTP).
    pub explicit: Option<SocketAddr>,
    /// Transparent listener for connections redirected by nftables (REDIRECT).
    pub transparent: Option<SocketAddr>,
    /// SNI relay listeners: like transparent, but for connections that were not redirected;
    /// they dial the SNI or Host name on the given port (for SNI-routing front ends and
    /// benchmarks).
    pub sni_relays: Vec<(SocketAddr, u16)>,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
    pub admin: Option<SocketAddr>,
    /// DNS responder for sandboxes (UDP): allowed names answered, others NXDOMAIN.
    pub dns: Option<SocketAddr>,
    /// Upstream DNS servers; empty means the system's (`/etc/resolv.conf`).
    pub dns_servers: Vec<SocketAddr>,
    /// The policy file to watch for changes; `None` for the embedded default.
    pub policy_path: Option<PathBuf>,
    /// How often the policy file is checked for changes.
    pub policy_poll: Duration,
    /// Worker threads serving connections (each a single-threaded runtime).
    pub workers: usize,
    /// Limits on clients and upstreams.
    pub limits: Limits,
    /// TLS interception for hosts with credential or git rules; `None` when the policy has none.
    pub interceptor: Option<std::sync::Arc<crate::intercept::Interceptor>>,
    /// Metrics to use (the interceptor registers into the same set); `None` makes new ones.
    pub metrics: Option<crate::ProxyMetrics>,
    /// The sandbox this proxy serves, when it serves one (`sandgate run`): every connection's
    /// log event carries it.
    pub sandbox: Option<String>,
    /// The policy profile every client of this proxy gets, when it serves one sandbox; `None`
    /// selects profiles by client address and Proxy-Authorization user.
    pub profile: Option<String>,
    /// Node-agent mode: the sandboxes this proxy serves, each known by address and token.
    /// When set, every explicit-proxy request must carry a sandbox's credentials from its own
    /// address (else 407), and the sandbox's profile applies. Only the explicit listener
    /// authenticates: do not open transparent or SNI listeners in this mode.
    pub identities: Option<std::sync::Arc<crate::identity::Identities>>,
}

/// Limits that keep one client or one connection from disturbing the others.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request head accepted (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Time allowed for a client to send a complete request head (slowloris defence).
    pub header_timeout: Duration,
    /// Largest ClientHello accepted, in bytes (post-quantum key shares make it over 1.5 KB).
    pub max_hello_bytes: usize,
    /// Time allowed for a complete ClientHello, once the client has started sending.
    pub hello_timeout: Duration,
    /// Time a transparent client may stay silent before it is judged by address alone
    /// (server-speaks-first protocols).
    pub first_byte_timeout: Duration,
    /// Time allowed for an upstream TCP connect.
    pub connect_timeout: Duration,
    /// A tunnel or keep-alive connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// Concurrent client connections in all.
    pub max_connections: usize,
    /// Concurrent client connections from one source address.
    pub max_connections_per_client: usize,
    /// Time SIGTERM waits for live connections before exiting.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_header_bytes: 32 * 1024,
            header_timeout: Duration::from_secs(10),
            max_hello_bytes: 32 * 1024,
            hello_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            // Two descriptors per tunnel; the usual 20,000-descriptor limit allows about 9,500.
            max_connections: 9_500,
            max_connections_per_client: 4_096,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

/// Worker threads by default: half the CPUs, at least one. The proxy shares its machine with
/// the sandboxes it serves; on 2 shared cores one worker used about a third less CPU per
/// HTTPS request than two (fewer context switches, more events per wake-up), see the README.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (usize::from(n) / 2).max(1))
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            explicit: None,
            transparent: None,
            sni_relays: Vec::new(),
            admin: None,
            dns: None,
            dns_servers: Vec::new(),
            policy_path: None,
            policy_poll: Duration::from_secs(2),
            workers: default_workers(),
            limits: Limits::default(),
            interceptor: None,
            metrics: None,
            sandbox: None,
            profile: None,
            identities: None,
        }
    }
}
