//! Why a connection ended without reaching its upstream (or ended badly), as a closed set of
//! labels shared by the log, the metrics and the client's error response.

use std::io;

/// A connection-level failure that is not a policy decision.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The request head was malformed (bad request line, CONNECT without port, no Host).
    #[error("malformed request: {0}")]
    MalformedRequest(&'static str),
    /// The ClientHello was not valid TLS.
    #[error("malformed TLS ClientHello")]
    MalformedHello,
    /// The ClientHello was larger than the limit.
    #[error("ClientHello larger than {0} bytes")]
    HelloTooLarge(usize),
    /// The ClientHello did not arrive in time.
    #[error("ClientHello not complete within the timeout")]
    HelloTimeout,
    /// The request head did not arrive in time.
    #[error("request head not complete within the timeout")]
    HeaderTimeout,
    /// The request head was larger than the limit.
    #[error("request head larger than {0} bytes")]
    HeaderTooLarge(usize),
    /// The transparent connection had no original destination (it was not redirected).
    #[error("no original destination (was the connection redirected by nftables?)")]
    NoOriginalDestination,
    /// Name resolution failed.
    #[error("could not resolve {host}: {reason}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's message.
        reason: String,
    },
    /// The upstream TCP connect failed.
    #[error("connect to {addr} failed: {source}")]
    Connect {
        /// The vetted address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The upstream TCP connect timed out.
    #[error("connect to {0} timed out")]
    ConnectTimeout(std::net::SocketAddr),
    /// Too many connections in all.
    #[error("connection limit reached")]
    LimitTotal,
    /// Too many connections from this client.
    #[error("per-client connection limit reached")]
    LimitClient,
    /// The tunnel or connection was idle too long.
    #[error("idle timeout")]
    Idle,
    /// An I/O error on the client or upstream side after the connection was set up.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The upstream HTTP exchange failed.
    #[error("upstream HTTP: {0}")]
    UpstreamHttp(String),
    /// The client's TLS handshake with Sandgate's leaf failed (does the sandbox trust
    /// Sandgate's CA?).
    #[error("client TLS handshake failed: {0}; the sandbox must trust Sandgate's CA (`sandgate ca cert`)")]
    ClientTls(String),
    /// The origin's certificate did not verify, or its TLS failed: nothing was sent to it.
    #[error("origin TLS failed, nothing was sent: {0}")]
    UpstreamTls(String),
    /// Node-agent mode: the client is not a sandbox this proxy serves.
    #[error("proxy authentication failed: {}", .0.describe())]
    ProxyAuth(crate::identity::AuthError),
    /// A credential could not be read or applied.
    #[error("credential unavailable: {0}")]
    Credential(String),
}

/// Which side a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong or too slowly.
    Client,
    /// The upstream could not be resolved, reached or spoken to.
    Upstream,
    /// A limit of the proxy's.
    Limit,
    /// Sandgate itself (its vault or configuration).
    Internal,
}

impl ProxyError {
    /// A stable label for logs and metrics.
    pub fn as_label(&self) -> &'static str {
        match self {
            Self::MalformedRequest(_) => "malformed_request",
            Self::MalformedHello => "malformed_hello",
            Self::HelloTooLarge(_) => "hello_too_large",
            Self::HelloTimeout => "hello_timeout",
            Self::HeaderTimeout => "header_timeout",
            Self::HeaderTooLarge(_) => "header_too_large",
            Self::NoOriginalDestination => "no_original_destination",
            Self::Resolve { .. } => "resolve_failed",
            Self::Connect { .. } => "connect_failed",
            Self::ConnectTimeout(_) => "connect_timeout",
            Self::LimitTotal => "limit_connections",
            Self::LimitClient => "limit_client_connections",
            Self::Idle => "idle_timeout",
            Self::Io(_) => "io_error",
            Self::UpstreamHttp(_) => "upstream_http_error",
            Self::ClientTls(_) => "client_tls_failed",
            Self::UpstreamTls(_) => "upstream_tls_failed",
            Self::Credential(_) => "credential_unavailable",
            Self::ProxyAuth(e) => e.as_label(),
        }
    }

    /// Which side is at fault.
    pub fn side(&self) -> Side {
        match self {
            Self::MalformedRequest(_)
            | Self::MalformedHello
            | Self::HelloTooLarge(_)
            | Self::HelloTimeout
            | Self::HeaderTimeout
            | Self::HeaderTooLarge(_)
            | Self::NoOriginalDestination
            | Self::Idle
            | Self::ClientTls(_)
            | Self::ProxyAuth(_)
            | Self::Io(_) => Side::Client,
            Self::Resolve { .. }
            | Self::Connect { .. }
            | Self::ConnectTimeout(_)
            | Self::UpstreamHttp(_)
            | Self::UpstreamTls(_) => Side::Upstream,
            Self::LimitTotal | Self::LimitClient => Side::Limit,
            Self::Credential(_) => Side::Internal,
        }
    }

    /// The HTTP status an explicit-mode client gets for this failure.
    pub fn status(&self) -> u16 {
        if let Self::ProxyAuth(_) = self {
            return 407;
        }
        match self.side() {
            Side::Client => 400,
            Side::Upstream => match self {
                Self::ConnectTimeout(_) => 504,
                _ => 502,
            },
            Side::Limit => 503,
            Side::Internal => 500,
        }
    }
}
