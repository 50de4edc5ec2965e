//! Dialling upstreams: the only place the proxy opens an upstream socket, and it takes a
//! `Permit`, which only the policy can issue for an address it vetted.

use std::time::{Duration, Instant};

use sandgate_policy::Permit;
use tokio::net::TcpStream;

use crate::error::ProxyError;
use crate::metrics::ProxyMetrics;

/// Connects to the permitted address within `timeout`.
pub(crate) async fn dial(permit: &Permit, timeout: Duration, metrics: &ProxyMetrics) -> Result<TcpStream, ProxyError> {
    let addr = permit.upstream();
    let started = Instant::now();
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(ProxyError::Connect { addr, source }),
        Err(_) => return Err(ProxyError::ConnectTimeout(addr)),
    };
    metrics.connect_seconds.observe(started.elapsed().as_secs_f64());
    // Small writes (TLS handshakes, request heads) must not wait for Nagle.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
