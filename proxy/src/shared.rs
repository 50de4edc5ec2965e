//! State shared by every listener and connection: the live policy, the resolver, metrics,
//! limits, the pipe pool and the connection limiter; and the decide-resolve-vet-dial sequence
//! every listener uses to open an upstream.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sandgate_policy::{CompiledPolicy, Decision, Host, ProfileId};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};

use crate::config::Limits;
use crate::connect;
use crate::error::ProxyError;
use crate::log::ConnRecord;
use crate::metrics::ProxyMetrics;
use crate::resolve::Resolver;
use crate::tunnel::PipePool;

/// What every connection task can reach.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) policy: watch::Receiver<Arc<CompiledPolicy>>,
    pub(crate) resolver: Resolver,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) limits: Limits,
    pub(crate) pipes: PipePool,
    pub(crate) next_id: AtomicU64,
    pub(crate) draining: AtomicBool,
    pub(crate) active: AtomicUsize,
    pub(crate) idle: Notify,
    pub(crate) interceptor: Option<Arc<crate::intercept::Interceptor>>,
    pub(crate) sandbox: Option<String>,
    pub(crate) profile: Option<String>,
    pub(crate) identities: Option<Arc<crate::identity::Identities>>,
    per_client: Mutex<HashMap<IpAddr, usize>>,
}

/// Why an upstream was not opened.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The policy refused (the decision is also in the record).
    Denied(Decision),
    /// Resolution or connection failed.
    Failed(ProxyError),
}

/// Holds a connection's place under the limits and in the active-connections gauge;
/// released on drop, wherever the connection's last task ends.
#[derive(Debug)]
pub(crate) struct ConnGuard {
    shared: Arc<Shared>,
    client: IpAddr,
    gauge: prometheus::IntGauge,
}

// === impl Shared ===

impl Shared {
    pub(crate) fn new(
        policy: watch::Receiver<Arc<CompiledPolicy>>,
        resolver: Resolver,
        metrics: ProxyMetrics,
        limits: Limits,
        interceptor: Option<Arc<crate::intercept::Interceptor>>,
        sandbox: Option<String>,
        profile: Option<String>,
    ) -> Self {
        Self {
            policy,
            resolver,
            metrics,
            limits,
            pipes: PipePool::default(),
            next_id: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            idle: Notify::new(),
            interceptor,
            sandbox,
            profile,
            identities: None,
            per_client: Mutex::new(HashMap::new()),
        }
    }

    /// The policy in force now; each connection takes it once and keeps it.
    pub(crate) fn policy(&self) -> Arc<CompiledPolicy> {
        self.policy.borrow().clone()
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The profile for a client: the one this proxy was given for its sandbox, else the
    /// policy's choice by address and user.
    pub(crate) fn profile_for(&self, policy: &CompiledPolicy, client: IpAddr, user: Option<&str>) -> ProfileId {
        self.profile
            .as_deref()
            .and_then(|name| policy.profile_id(name))
            .unwrap_or_else(|| policy.select_profile(client, user))
    }

    /// The profile for an explicit-proxy client: in node-agent mode the one of the sandbox
    /// whose credentials it presents from that sandbox's address, else [`Shared::profile_for`].
    pub(crate) fn authorize(
        &self,
        policy: &CompiledPolicy,
        client: IpAddr,
        cred: Option<&crate::identity::Credential>,
    ) -> Result<ProfileId, crate::identity::AuthError> {
        let Some(ids) = &self.identities else {
            return Ok(self.profile_for(policy, client, cred.map(|c| c.user.as_str())));
        };
        let cred = cred.ok_or(crate::identity::AuthError::Missing)?;
        let profile = ids.check(client, &cred.user, cred.token())?;
        policy.profile_id(&profile).ok_or(crate::identity::AuthError::UnknownProfile)
    }

    /// A new connection record, labelled with the sandbox this proxy serves when it serves one
    /// (`sandgate run`); a Proxy-Authorization user may name another later.
    pub(crate) fn record(&self, listener: crate::log::Listener, client: std::net::SocketAddr) -> Box<ConnRecord> {
        let mut rec = ConnRecord::new(self.next_id(), listener, client);
        rec.sandbox.clone_from(&self.sandbox);
        rec
    }

    /// Takes a place for a new connection from `client`, or says which limit is full.
    pub(crate) fn admit(
        self: &Arc<Self>,
        client: IpAddr,
        gauge: &prometheus::IntGauge,
    ) -> Result<ConnGuard, ProxyError> {
        if self.active.fetch_add(1, Ordering::AcqRel) >= self.limits.max_connections {
            self.release_total();
            return Err(ProxyError::LimitTotal);
        }
        let mut map = match self.per_client.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        let n = map.entry(client).or_insert(0);
        if *n >= self.limits.max_connections_per_client {
            drop(map);
            self.release_total();
            return Err(ProxyError::LimitClient);
        }
        *n += 1;
        gauge.inc();
        Ok(ConnGuard { shared: self.clone(), client, gauge: gauge.clone() })
    }

    fn release_total(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 && self.draining.load(Ordering::Acquire) {
            self.idle.notify_waiters();
        }
    }

    /// Decides, resolves, vets and dials, recording each step in `rec`.
    pub(crate) async fn open_upstream(
        &self,
        policy: &CompiledPolicy,
        rec: &mut ConnRecord,
        profile: ProfileId,
        host: &Host,
        port: u16,
    ) -> Result<TcpStream, Refusal> {
        let decision = policy.decide(profile, host, port);
        rec.decision = Some(decision);
        if !decision.verdict.proceeds() {
            return Err(Refusal::Denied(decision));
        }
        let resolved;
        let addrs: &[IpAddr] = match host {
            Host::Ip(ip) => std::slice::from_ref(ip),
            Host::Name(name) => {
                resolved = self.resolver.resolve(policy, name, &self.metrics).await.map_err(Refusal::Failed)?;
                &resolved
            }
        };
        let permit = policy.vet(&decision, addrs, port).map_err(|d| {
            rec.decision = Some(d);
            Refusal::Denied(d)
        })?;
        rec.decision = Some(*permit.decision());
        rec.dialled = Some(permit.upstream());
        connect::dial(&permit, self.limits.connect_timeout, &self.metrics).await.map_err(Refusal::Failed)
    }
}

/// A complete `Connection: close` HTTP/1.1 response with a text body and the reason header,
/// for answers written straight to a socket (outside hyper).
pub(crate) fn raw_response(status: &str, reason: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\nx-sandgate-reason: {reason}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The one-line body of a denial: what was denied, why, and under which profile.
pub(crate) fn denial_message(policy: &CompiledPolicy, host: &str, port: u16, d: &Decision) -> String {
    format!("sandgate: denied {host}:{port} ({}; profile {})\n", d.reason.describe(), policy.profile_name(d.profile))
}

// === impl ConnGuard ===

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.gauge.dec();
        if let Ok(mut map) = self.shared.per_client.lock()
            && let Some(n) = map.get_mut(&self.client)
        {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.client);
            }
        }
        self.shared.release_total();
    }
}
