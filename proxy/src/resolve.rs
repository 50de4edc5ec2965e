//! Name resolution: the policy's static `resolve:` entries first, then hickory-resolver with
//! its TTL cache. The proxy resolves every name itself and dials only addresses it vetted, so
//! a client's own DNS (or a rebinding answer) never chooses where a connection goes.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ProtocolConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use sandgate_policy::{CompiledPolicy, HostName};

use crate::error::ProxyError;
use crate::metrics::ProxyMetrics;

/// Entries kept in the resolver's cache.
const CACHE_ENTRIES: u64 = 4096;

/// Resolves names for the proxy.
#[derive(Clone)]
pub(crate) struct Resolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

/// Addresses for a name, in the order to try them.
pub(crate) type Addrs = Vec<IpAddr>;

// === impl Resolver ===

impl Resolver {
    /// A resolver using `servers`, or the system configuration when `servers` is empty.
    pub(crate) fn new(servers: &[SocketAddr]) -> Result<Self, String> {
        let mut builder = if servers.is_empty() {
            TokioResolver::builder_tokio().map_err(|e| format!("reading the system DNS configuration: {e}"))?
        } else {
            let mut config = ResolverConfig::from_name_servers(Vec::new());
            for s in servers {
                let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                ns.connections = [ProtocolConfig::Udp, ProtocolConfig::Tcp]
                    .into_iter()
                    .map(|p| {
                        let mut c = ConnectionConfig::new(p);
                        c.port = s.port();
                        c
                    })
                    .collect();
                config.add_name_server(ns);
            }
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
        };
        builder.options_mut().cache_size = CACHE_ENTRIES;
        let inner = builder.build().map_err(|e| format!("building the resolver: {e}"))?;
        Ok(Self { inner })
    }

    /// Resolves `name`: static entries from the policy, else DNS. An empty answer is an error.
    pub(crate) async fn resolve(
        &self,
        policy: &CompiledPolicy,
        name: &HostName,
        metrics: &ProxyMetrics,
    ) -> Result<Addrs, ProxyError> {
        let started = Instant::now();
        if let Some(addrs) = policy.static_addrs(name) {
            metrics.dns_seconds.with_label_values(&["static"]).observe(started.elapsed().as_secs_f64());
            return Ok(addrs.to_vec());
        }
        // A trailing dot makes the name absolute, so no search domain is ever appended.
        let fqdn = format!("{name}.");
        let result = self.inner.lookup_ip(fqdn.as_str()).await;
        metrics.dns_seconds.with_label_values(&["dns"]).observe(started.elapsed().as_secs_f64());
        let lookup =
            result.map_err(|e| ProxyError::Resolve { host: name.as_str().to_owned(), reason: e.to_string() })?;
        let addrs: Addrs = lookup.iter().collect();
        if addrs.is_empty() {
            return Err(ProxyError::Resolve { host: name.as_str().to_owned(), reason: "no addresses".to_owned() });
        }
        Ok(addrs)
    }
}
