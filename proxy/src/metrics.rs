//! Every metric the proxy exports, registered on an explicit registry. Labels come from closed
//! sets (listener, profile names from the policy, verdicts, reasons, error labels), never from
//! anything a sandbox controls, so a sandbox cannot grow the series count.

use prometheus::{Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Buckets for upstream connect and DNS latency, in seconds: 100 µs to 10 s.
const LATENCY_BUCKETS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

/// The proxy's metrics.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    registry: Registry,
    /// `sandgate_proxy_connections_total{listener, profile, mode, verdict, reason}`.
    pub connections: IntCounterVec,
    /// `sandgate_proxy_active_connections{listener}`.
    pub active: IntGaugeVec,
    /// `sandgate_proxy_bytes_total{profile, direction}`.
    pub bytes: IntCounterVec,
    /// `sandgate_proxy_upstream_connect_seconds`.
    pub connect_seconds: Histogram,
    /// `sandgate_proxy_dns_seconds{source}`.
    pub dns_seconds: HistogramVec,
    /// `sandgate_proxy_policy_reloads_total{result}`.
    pub reloads: IntCounterVec,
    /// `sandgate_proxy_credentials_injected_total{credential}`.
    pub injected: IntCounterVec,
    /// `sandgate_proxy_leaf_mint_seconds`.
    pub leaf_mint_seconds: Histogram,
}

// === impl ProxyMetrics ===

impl ProxyMetrics {
    /// Creates and registers every metric on a new registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        Self::on(Registry::new())
    }

    /// Like [`ProxyMetrics::new`], every series labelled `sandbox="<id>"`: for the proxy that
    /// `sandgate run` starts for one sandbox. The id is Sandgate's, never the sandbox's word.
    pub fn for_sandbox(id: &str) -> Result<Self, prometheus::Error> {
        let labels = std::collections::HashMap::from([("sandbox".to_owned(), id.to_owned())]);
        Self::on(Registry::new_custom(None, Some(labels))?)
    }

    fn on(registry: Registry) -> Result<Self, prometheus::Error> {
        let connections = IntCounterVec::new(
            Opts::new(
                "sandgate_proxy_connections_total",
                "Connections and proxied requests decided, by listener, profile, mode, verdict and reason.",
            ),
            &["listener", "profile", "mode", "verdict", "reason"],
        )?;
        let active = IntGaugeVec::new(
            Opts::new("sandgate_proxy_active_connections", "Client connections open now, by listener."),
            &["listener"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "sandgate_proxy_bytes_total",
                "Bytes relayed, by profile and direction (up: client to upstream).",
            ),
            &["profile", "direction"],
        )?;
        let connect_seconds = Histogram::with_opts(
            HistogramOpts::new("sandgate_proxy_upstream_connect_seconds", "Upstream TCP connect latency.")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let dns_seconds = HistogramVec::new(
            HistogramOpts::new(
                "sandgate_proxy_dns_seconds",
                "Name resolution latency, by source (static: the policy's resolve entries).",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["source"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new("sandgate_proxy_policy_reloads_total", "Policy reloads, by result (ok or error)."),
            &["result"],
        )?;
        let injected = IntCounterVec::new(
            Opts::new(
                "sandgate_proxy_credentials_injected_total",
                "Requests that got a credential from the vault, by credential rule name.",
            ),
            &["credential"],
        )?;
        let leaf_mint_seconds = Histogram::with_opts(
            HistogramOpts::new("sandgate_proxy_leaf_mint_seconds", "Time to mint a leaf certificate (cache misses).")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )?;
        let build = IntGaugeVec::new(
            Opts::new("sandgate_build_info", "Always 1; the labels name the running build."),
            &["version"],
        )?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(connect_seconds.clone()))?;
        registry.register(Box::new(dns_seconds.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(injected.clone()))?;
        registry.register(Box::new(leaf_mint_seconds.clone()))?;
        registry.register(Box::new(build))?;
        for result in ["ok", "error"] {
            reloads.with_label_values(&[result]);
        }
        Ok(Self {
            registry,
            connections,
            active,
            bytes,
            connect_seconds,
            dns_seconds,
            reloads,
            injected,
            leaf_mint_seconds,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec cannot fail for the text format.
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_proxy_labels_every_series() {
        let m = ProxyMetrics::for_sandbox("a1b2c3").unwrap();
        m.connections.with_label_values(&["transparent", "default", "enforce", "deny", "host_not_allowed"]).inc();
        let text = String::from_utf8(m.encode()).unwrap();
        let line = text.lines().find(|l| l.starts_with("sandgate_proxy_connections_total{")).unwrap();
        assert!(line.contains("sandbox=\"a1b2c3\"") && line.ends_with(" 1"), "{line}");
        assert!(text.contains("sandgate_build_info{version=\"0.1.0\",sandbox=\"a1b2c3\"} 1"), "{text}");
        let plain = String::from_utf8(ProxyMetrics::new().unwrap().encode()).unwrap();
        assert!(!plain.contains("sandbox="), "{plain}");
    }
}
