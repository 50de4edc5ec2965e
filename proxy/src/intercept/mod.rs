//! Interception for hosts a credential or git rule names, and only those: Sandgate terminates
//! the client's TLS with a leaf from its own CA (ALPN `h2`, `http/1.1`), checks each request
//! against the git rules and placeholders, injects the credential, and re-encrypts to the
//! real origin with full certificate verification (system roots, plus `--upstream-ca`).
//! HTTP/1.1 and HTTP/2 on both sides, trailers forwarded, WebSocket upgrades relayed.

mod ca;
pub mod inject;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use bytes::BytesMut;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use sandgate_policy::{CompiledPolicy, Decision, GitOp, GitVerdict, HostName, ProfileId, Reason};
use sandgate_vault::Vault;
use tokio::net::TcpStream;

pub use ca::{CA_CERT_SECRET, CA_KEY_SECRET, CaError, CertAuthority};

use crate::error::ProxyError;
use crate::explicit::{Counted, Finisher, Prefixed, ProxyBody, empty, strip_hop_by_hop, text_response};
use crate::log::{ConnRecord, Listener, redact_path};
use crate::shared::{Shared, denial_message};

/// ALPN protocols offered to clients and origins.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Everything interception needs: the CA, the vault the credentials come from, and the TLS
/// configurations of both sides.
pub struct Interceptor {
    ca: Arc<CertAuthority>,
    vault: Vault,
    server: Arc<rustls::ServerConfig>,
    upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Interceptor(..)")
    }
}

/// Why interception could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InterceptSetupError {
    /// The CA could not be loaded.
    #[error("{0}; create one with `sandgate ca init`")]
    Ca(#[from] CaError),
    /// An extra CA file could not be read.
    #[error("upstream CA file {path}: {problem}")]
    UpstreamCa {
        /// The file.
        path: PathBuf,
        /// Why.
        problem: String,
    },
    /// A policy names a secret the vault does not hold.
    #[error("credential `{rule}` needs the secret `{secret}`, which the vault does not hold: {problem}")]
    Secret {
        /// The credential rule.
        rule: String,
        /// The secret's name.
        secret: String,
        /// Why it could not be read.
        problem: String,
    },
    /// TLS configuration failed.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Picks (or mints) the leaf for the server name the client asked for.
#[derive(Debug)]
struct LeafResolver {
    ca: Arc<CertAuthority>,
    mint_seconds: prometheus::Histogram,
}

impl rustls::server::ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let name = hello.server_name()?;
        let started = Instant::now();
        match self.ca.leaf(name) {
            Ok((leaf, minted)) => {
                if minted {
                    self.mint_seconds.observe(started.elapsed().as_secs_f64());
                }
                Some(leaf)
            }
            Err(e) => {
                tracing::error!(sni = name, "cannot mint a leaf certificate: {e}");
                None
            }
        }
    }
}

// === impl Interceptor ===

impl Interceptor {
    /// Loads the CA from `vault`, checks that every credential the policy names is in it, and
    /// builds both TLS configurations. `upstream_cas` are trusted for origins besides the
    /// system roots.
    pub fn new(
        vault: Vault,
        policy: &CompiledPolicy,
        upstream_cas: &[PathBuf],
        metrics: &crate::ProxyMetrics,
    ) -> Result<Arc<Self>, InterceptSetupError> {
        let ca = Arc::new(CertAuthority::load(&vault)?);
        for c in policy.credentials() {
            if let Err(e) = vault.get(c.secret()) {
                return Err(InterceptSetupError::Secret {
                    rule: c.name().to_owned(),
                    secret: c.secret().to_owned(),
                    problem: e.to_string(),
                });
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = LeafResolver { ca: ca.clone(), mint_seconds: metrics.leaf_mint_seconds.clone() };
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| InterceptSetupError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        server.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();

        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        for path in upstream_cas {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| InterceptSetupError::UpstreamCa { path: path.clone(), problem: e.to_string() })?;
            if certs.is_empty() {
                return Err(InterceptSetupError::UpstreamCa {
                    path: path.clone(),
                    problem: "no certificate in it".into(),
                });
            }
            roots.add_parsable_certificates(certs);
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| InterceptSetupError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(Self { ca, vault, server: Arc::new(server), upstream: Arc::new(upstream) }))
    }

    /// The CA certificate sandboxes must trust.
    pub fn ca_cert_pem(&self) -> &str {
        self.ca.cert_pem()
    }
}

/// The origin side of an intercepted connection.
enum Upstream {
    H1(tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Counted<Incoming>>>),
    H2(hyper::client::conn::http2::SendRequest<Counted<Incoming>>),
    /// The origin's TLS failed: every request is answered 502 and nothing is injected.
    Failed(String),
}

/// One intercepted connection's context, shared by its requests.
struct Ctx {
    shared: Arc<Shared>,
    icpt: Arc<Interceptor>,
    policy: Arc<CompiledPolicy>,
    name: HostName,
    port: u16,
    profile: ProfileId,
    decision: Decision,
    client: SocketAddr,
    sandbox: Option<String>,
    dialled: Option<SocketAddr>,
    upstream: Upstream,
}

/// Serves an intercepted CONNECT tunnel to its end.
#[expect(clippy::too_many_arguments, reason = "one call site; a struct would only rename them")]
pub(crate) async fn serve(
    shared: Arc<Shared>,
    icpt: Arc<Interceptor>,
    policy: Arc<CompiledPolicy>,
    client: TcpStream,
    early: BytesMut,
    upstream: TcpStream,
    mut rec: Box<ConnRecord>,
    profile: ProfileId,
    name: HostName,
    port: u16,
) {
    rec.intercepted = true;
    let acceptor = tokio_rustls::TlsAcceptor::from(icpt.server.clone());
    let io = Prefixed { prefix: early.freeze(), inner: client };
    let tls = match tokio::time::timeout(shared.limits.hello_timeout, acceptor.accept(io)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            rec.fail(&ProxyError::ClientTls(e.to_string()));
            return rec.finish(&policy, &shared.metrics);
        }
        Err(_) => {
            rec.fail(&ProxyError::HelloTimeout);
            return rec.finish(&policy, &shared.metrics);
        }
    };
    let sni = tls.get_ref().1.server_name().map(str::to_owned);
    rec.sni = sni.clone();
    if sni.as_deref().is_some_and(|s| HostName::parse(s).ok().as_ref() != Some(&name)) {
        rec.decision = Some(policy.refuse(profile, Reason::SniMismatch));
        return rec.finish(&policy, &shared.metrics);
    }
    let server_name = ServerName::try_from(name.as_str().to_owned());
    let connector = tokio_rustls::TlsConnector::from(icpt.upstream.clone());
    let upstream = match server_name {
        Ok(sn) => match tokio::time::timeout(shared.limits.connect_timeout, connector.connect(sn, upstream)).await {
            Ok(Ok(up)) => handshake(up).await,
            Ok(Err(e)) => Upstream::Failed(format!("TLS to {name}: {e}")),
            Err(_) => Upstream::Failed(format!("TLS to {name} timed out")),
        },
        Err(e) => Upstream::Failed(e.to_string()),
    };
    if let Upstream::Failed(why) = &upstream {
        tracing::warn!(host = %name, "intercepted origin refused: {why}");
    }
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        icpt,
        policy: policy.clone(),
        name,
        port,
        profile,
        decision: rec.decision.unwrap_or_else(|| policy.refuse(profile, Reason::HostNotAllowed)),
        client: rec.client,
        sandbox: rec.sandbox.clone(),
        dialled: rec.dialled,
        upstream,
    });
    let service = hyper::service::service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, std::convert::Infallible>(ctx.handle(req).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection_with_upgrades(TokioIo::new(tls), service).await {
        tracing::debug!("intercepted connection ended: {e}");
    }
    rec.finish(&policy, &shared.metrics);
}

/// Speaks HTTP to the origin over its TLS connection, HTTP/2 if it chose `h2`.
async fn handshake(tls: tokio_rustls::client::TlsStream<TcpStream>) -> Upstream {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    if h2 {
        match hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await {
            Ok((sender, conn)) => {
                tokio::spawn(conn);
                Upstream::H2(sender)
            }
            Err(e) => Upstream::Failed(format!("HTTP/2 handshake: {e}")),
        }
    } else {
        match hyper::client::conn::http1::handshake(io).await {
            Ok((sender, conn)) => {
                tokio::spawn(conn.with_upgrades());
                Upstream::H1(tokio::sync::Mutex::new(sender))
            }
            Err(e) => Upstream::Failed(format!("HTTP/1.1 handshake: {e}")),
        }
    }
}

// === impl Ctx ===

impl Ctx {
    async fn handle(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let mut rec = self.shared.record(Listener::Explicit, self.client);
        rec.intercepted = true;
        if self.sandbox.is_some() {
            rec.sandbox = self.sandbox.clone();
        }
        rec.host = Some(self.name.to_string());
        rec.port = self.port;
        rec.sni = Some(self.name.to_string());
        rec.dialled = self.dialled;
        rec.decision = Some(self.decision);
        rec.method = Some(req.method().as_str().to_owned());
        let path = req.uri().path().to_owned();
        rec.path = req.uri().path_and_query().map(|p| redact_path(p.as_str()));

        if let Upstream::Failed(why) = &self.upstream {
            return self.fail(rec, ProxyError::UpstreamTls(why.clone()));
        }
        // Repository scoping of git smart HTTP.
        if let Some(rule) = self.policy.git_rule_for(&self.name)
            && let GitVerdict::Denied { op, .. } = rule.check(&path, req.uri().query())
        {
            let reason = match op {
                GitOp::Fetch => Reason::GitFetchNotAllowed,
                GitOp::Push => Reason::GitPushNotAllowed,
            };
            return self.deny(rec, reason);
        }
        // A placeholder belongs to its own rule's hosts only.
        for c in self.policy.credentials() {
            if let Some(ph) = c.placeholder()
                && !c.covers_host(&self.name)
                && inject::carries(req.headers(), ph)
            {
                tracing::warn!(host = %self.name, credential = c.name(), "placeholder sent outside its rule; refused");
                return self.deny(rec, Reason::PlaceholderElsewhere);
            }
        }
        if let Some(c) = self.policy.credential_for(&self.name, &path) {
            let secret = match self.icpt.vault.get(c.secret()) {
                Ok(s) => s,
                Err(e) => return self.fail(rec, ProxyError::Credential(e.to_string())),
            };
            if let Err(e) = inject::inject(req.headers_mut(), c.apply(), c.secret(), &secret) {
                return self.fail(rec, ProxyError::Credential(e.to_string()));
            }
            rec.credential = Some(c.name().to_owned());
            self.shared.metrics.injected.with_label_values(&[c.name()]).inc();
        }

        let upgrade = req.headers().contains_key(header::UPGRADE);
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let upgrade_headers = upgrade
            .then(|| (parts.headers.get(header::CONNECTION).cloned(), parts.headers.get(header::UPGRADE).cloned()));
        strip_hop_by_hop(&mut parts.headers);
        if let Some((conn, up)) = upgrade_headers {
            if let Some(v) = conn {
                parts.headers.insert(header::CONNECTION, v);
            }
            if let Some(v) = up {
                parts.headers.insert(header::UPGRADE, v);
            }
        }
        let authority = if self.port == 443 { self.name.to_string() } else { format!("{}:{}", self.name, self.port) };
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        let up_count = Arc::new(AtomicU64::new(0));
        let body = Counted { inner: body, count: up_count.clone(), done: None };
        let sent = match &self.upstream {
            Upstream::H2(sender) => {
                parts.uri =
                    match Uri::builder().scheme("https").authority(authority.as_str()).path_and_query(pq).build() {
                        Ok(u) => u,
                        Err(e) => return self.fail(rec, ProxyError::UpstreamHttp(e.to_string())),
                    };
                parts.version = http::Version::HTTP_2;
                parts.headers.remove(header::HOST);
                let mut sender = sender.clone();
                sender.send_request(Request::from_parts(parts, body)).await
            }
            Upstream::H1(sender) => {
                parts.uri = match Uri::builder().path_and_query(pq).build() {
                    Ok(u) => u,
                    Err(e) => return self.fail(rec, ProxyError::UpstreamHttp(e.to_string())),
                };
                parts.version = http::Version::HTTP_11;
                if let Ok(v) = HeaderValue::from_str(&authority) {
                    parts.headers.insert(header::HOST, v);
                }
                let mut sender = sender.lock().await;
                if let Err(e) = sender.ready().await {
                    return self.fail(rec, ProxyError::UpstreamHttp(e.to_string()));
                }
                sender.send_request(Request::from_parts(parts, body)).await
            }
            Upstream::Failed(why) => return self.fail(rec, ProxyError::UpstreamTls(why.clone())),
        };
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => return self.fail(rec, ProxyError::UpstreamHttp(e.to_string())),
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_upgrade) = client_upgrade
        {
            let origin_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                if let (Ok(c), Ok(o)) = (client_upgrade.await, origin_upgrade.await) {
                    let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(o)).await;
                }
            });
            let (parts, _) = response.into_parts();
            rec.finish(&self.policy, &self.shared.metrics);
            return Response::from_parts(parts, empty());
        }
        let (mut parts, body) = response.into_parts();
        if parts.version != http::Version::HTTP_2 {
            strip_hop_by_hop(&mut parts.headers);
        }
        let finisher =
            Finisher { rec: Some(rec), up: up_count, policy: self.policy.clone(), shared: self.shared.clone() };
        let body = Counted { inner: body, count: Arc::new(AtomicU64::new(0)), done: Some(finisher) };
        Response::from_parts(parts, body.boxed())
    }

    fn deny(&self, mut rec: Box<ConnRecord>, reason: Reason) -> Response<ProxyBody> {
        let d = self.policy.refuse(self.profile, reason);
        rec.decision = Some(d);
        let body = denial_message(&self.policy, self.name.as_str(), self.port, &d);
        rec.finish(&self.policy, &self.shared.metrics);
        text_response(StatusCode::FORBIDDEN, reason.as_str(), body)
    }

    fn fail(&self, mut rec: Box<ConnRecord>, e: ProxyError) -> Response<ProxyBody> {
        rec.fail(&e);
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
        let body = format!("sandgate: {e}\n");
        let label = e.as_label();
        rec.finish(&self.policy, &self.shared.metrics);
        text_response(status, label, body)
    }
}
