//! The connection log: one JSON event per proxied connection (and per absolute-form HTTP
//! request) when it ends, on the `sandgate::conn` target. Field names are constants so tests
//! and auditors can rely on them. Never a credential, a Proxy-Authorization value or a query
//! string.

use std::net::SocketAddr;
use std::time::Instant;

use sandgate_policy::{CompiledPolicy, Decision};

use crate::metrics::ProxyMetrics;

/// The tracing target of connection events.
pub const TARGET: &str = "sandgate::conn";
/// Field: connection id, unique per process.
pub const CONN_ID: &str = "conn_id";
/// Field: the profile that decided.
pub const PROFILE: &str = "profile";
/// Field: the sandbox id from Proxy-Authorization, if any.
pub const SANDBOX: &str = "sandbox";
/// Field: the client's address.
pub const CLIENT: &str = "client";
/// Field: the listener (`explicit`, `transparent`, `sni`).
pub const LISTENER: &str = "listener";
/// Field: `enforce` or `report`.
pub const MODE: &str = "mode";
/// Field: the host the client asked for.
pub const DST_HOST: &str = "dst_host";
/// Field: the port the client asked for.
pub const DST_PORT: &str = "dst_port";
/// Field: the TLS server name seen, if any.
pub const SNI: &str = "sni";
/// Field: the address dialled.
pub const DST_ADDR: &str = "dst_addr";
/// Field: allow, deny, report or error.
pub const VERDICT: &str = "verdict";
/// Field: the rule's name.
pub const RULE: &str = "rule";
/// Field: the reason label.
pub const REASON: &str = "reason";
/// Field: bytes client to upstream.
pub const BYTES_UP: &str = "bytes_up";
/// Field: bytes upstream to client.
pub const BYTES_DOWN: &str = "bytes_down";
/// Field: milliseconds from accept to close.
pub const DURATION_MS: &str = "duration_ms";
/// Field: HTTP method (absolute-form requests).
pub const METHOD: &str = "method";
/// Field: HTTP path, query string redacted.
pub const PATH: &str = "path";
/// Field: an error message, when the connection failed.
pub const ERROR: &str = "error";
/// Field: the credential rule whose secret was injected.
pub const CREDENTIAL: &str = "credential";
/// Field: whether Sandgate terminated TLS.
pub const INTERCEPTED: &str = "intercepted";

/// Which listener accepted a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// CONNECT and absolute-form HTTP.
    Explicit,
    /// Redirected by nftables.
    Transparent,
    /// SNI relay (not redirected).
    Sni,
    /// The DNS responder.
    Dns,
}

impl Listener {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Explicit => "explicit",
            Self::Transparent => "transparent",
            Self::Sni => "sni",
            Self::Dns => "dns",
        }
    }
}

/// What is known about a connection, filled as it proceeds and emitted once at the end.
#[derive(Debug)]
pub struct ConnRecord {
    /// Connection id.
    pub id: u64,
    /// Listener.
    pub listener: Listener,
    /// Client address.
    pub client: SocketAddr,
    /// Accept time.
    pub started: Instant,
    /// Sandbox id claimed in Proxy-Authorization.
    pub sandbox: Option<String>,
    /// Requested host (as normalised) and port.
    pub host: Option<String>,
    /// Requested port.
    pub port: u16,
    /// SNI seen.
    pub sni: Option<String>,
    /// Address dialled.
    pub dialled: Option<SocketAddr>,
    /// The decision, once made.
    pub decision: Option<Decision>,
    /// HTTP method, for absolute-form requests.
    pub method: Option<String>,
    /// HTTP path without its query, for absolute-form requests.
    pub path: Option<String>,
    /// Bytes client to upstream.
    pub up: u64,
    /// Bytes upstream to client.
    pub down: u64,
    /// Error label and message, if the connection failed.
    pub error: Option<(&'static str, String)>,
    /// The credential rule whose secret was injected (its name, never the value).
    pub credential: Option<String>,
    /// Whether Sandgate terminated TLS for this request.
    pub intercepted: bool,
}

impl ConnRecord {
    /// A record for a newly accepted connection. Boxed: it travels through the connection's
    /// nested futures by pointer rather than being copied into each one's state.
    pub fn new(id: u64, listener: Listener, client: SocketAddr) -> Box<Self> {
        Box::new(Self {
            id,
            listener,
            client,
            started: Instant::now(),
            sandbox: None,
            host: None,
            port: 0,
            sni: None,
            dialled: None,
            decision: None,
            method: None,
            path: None,
            up: 0,
            down: 0,
            error: None,
            credential: None,
            intercepted: false,
        })
    }

    /// Records a failure.
    pub fn fail(&mut self, e: &crate::ProxyError) {
        self.error = Some((e.as_label(), e.to_string()));
    }

    /// Emits the log event and counts the connection. Call once, at the end.
    pub fn finish(self: Box<Self>, policy: &CompiledPolicy, metrics: &ProxyMetrics) {
        let profile = self.decision.map_or("default", |d| policy.profile_name(d.profile));
        let mode = self.decision.map_or("enforce", |d| d.mode.as_str());
        let (verdict, reason) = match (&self.error, self.decision) {
            // A denial is the decision even if writing the refusal then failed.
            (_, Some(d)) if !d.verdict.proceeds() => (d.verdict.as_str(), d.reason.as_str()),
            (Some((label, _)), _) if !matches!(*label, "idle_timeout" | "io_error") || self.dialled.is_none() => {
                ("error", *label)
            }
            (_, Some(d)) => (d.verdict.as_str(), d.reason.as_str()),
            (_, None) => ("error", "no_decision"),
        };
        let rule = self.decision.and_then(|d| d.rule).map_or("", |r| policy.rule_name(r));
        metrics.connections.with_label_values(&[self.listener.as_str(), profile, mode, verdict, reason]).inc();
        if self.up > 0 {
            metrics.bytes.with_label_values(&[profile, "up"]).inc_by(self.up);
        }
        if self.down > 0 {
            metrics.bytes.with_label_values(&[profile, "down"]).inc_by(self.down);
        }
        let duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        tracing::info!(
            target: TARGET,
            conn_id = self.id,
            listener = self.listener.as_str(),
            client = %self.client,
            profile,
            sandbox = self.sandbox.as_deref(),
            mode,
            dst_host = self.host.as_deref(),
            dst_port = self.port,
            sni = self.sni.as_deref(),
            dst_addr = self.dialled.map(tracing::field::display),
            verdict,
            rule,
            reason,
            bytes_up = self.up,
            bytes_down = self.down,
            duration_ms = (duration_ms * 1000.0).round() / 1000.0,
            method = self.method.as_deref(),
            path = self.path.as_deref(),
            error = self.error.as_ref().map(|(_, m)| m.as_str()),
            credential = self.credential.as_deref(),
            intercepted = self.intercepted,
            "connection closed"
        );
    }
}

/// The path of a request target with any query string replaced by `?REDACTED`, since queries
/// carry tokens often enough that logging them is a leak.
pub fn redact_path(path_and_query: &str) -> String {
    match path_and_query.split_once('?') {
        Some((path, _)) => format!("{path}?REDACTED"),
        None => path_and_query.to_owned(),
    }
}
