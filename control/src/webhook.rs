//! `sandgate webhook`: the sidecar injector's HTTPS server. Kubernetes POSTs AdmissionReview v1
//! documents to `/inject/namespace` (pods of opted-in namespaces) or `/inject/pod` (pods that
//! opt in themselves); the decision is `sandgate_sidecar::webhook::review`. The certificate and
//! key are re-read when their files change, so cert-manager's renewals need no restart. An
//! optional plain-HTTP admin listener serves `/metrics` (reviews by verdict) and `/healthz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sandgate_sidecar::webhook::{InjectConfig, Scope, Verdict, review};
use serde_json::Value;

/// The largest AdmissionReview accepted (the API server's own request limit is 3 MiB).
const MAX_BODY: usize = 4 << 20;
/// How long a TLS handshake or a request head may take (the API server's own webhook
/// timeout is at most 30 s, and 5 s in deploy/).
const IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// The certificate or key file could not be used.
    #[error("TLS certificate {cert} / key {key}: {why}")]
    Tls {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
}

/// The webhook's counters.
#[derive(Clone)]
pub(crate) struct WebhookMetrics {
    registry: prometheus::Registry,
    reviews: prometheus::IntCounterVec,
}

impl WebhookMetrics {
    /// `sandgate_webhook_reviews_total{verdict}`: injected, unchanged, refused, invalid.
    pub(crate) fn new() -> Result<Self, prometheus::Error> {
        let registry = prometheus::Registry::new();
        let reviews = prometheus::IntCounterVec::new(
            prometheus::Opts::new("sandgate_webhook_reviews_total", "AdmissionReviews answered, by verdict."),
            &["verdict"],
        )?;
        registry.register(Box::new(reviews.clone()))?;
        for v in ["injected", "unchanged", "refused", "invalid"] {
            reviews.with_label_values(&[v]);
        }
        Ok(Self { registry, reviews })
    }

    fn count(&self, verdict: &str) {
        self.reviews.with_label_values(&[verdict]).inc();
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out);
        out
    }
}

/// Serves `/metrics` and `/healthz` over plain HTTP on `addr` until the process is stopped.
pub(crate) async fn serve_admin(addr: SocketAddr, metrics: WebhookMetrics) -> Result<(), WebhookError> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| WebhookError::Bind(addr, e))?;
    let bound = listener.local_addr().map_err(|e| WebhookError::Bind(addr, e))?;
    tracing::info!(listener = "admin", addr = %bound, "listening");
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let metrics = metrics.clone();
                async move {
                    Ok::<_, Infallible>(match req.uri().path() {
                        "/metrics" => reply(StatusCode::OK, metrics.encode()),
                        "/healthz" => reply(StatusCode::OK, "ok\n".into()),
                        _ => reply(StatusCode::NOT_FOUND, "try /metrics or /healthz\n".into()),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Serves until the process is stopped.
pub(crate) async fn serve(
    listen: SocketAddr,
    cert: PathBuf,
    key: PathBuf,
    config: InjectConfig,
    metrics: WebhookMetrics,
) -> Result<(), WebhookError> {
    let resolver = Arc::new(FileCert::load(cert, key)?);
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| resolver.error(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| WebhookError::Bind(listen, e))?;
    let addr = listener.local_addr().map_err(|e| WebhookError::Bind(listen, e))?;
    tracing::info!(listener = "webhook", %addr, "listening");
    let config = Arc::new(config);
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        let (acceptor, config, metrics) = (acceptor.clone(), config.clone(), metrics.clone());
        tokio::spawn(async move {
            // A client that stalls (handshake or request head) is dropped after IDLE.
            let tls = match tokio::time::timeout(IDLE, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |req| handle(req, config.clone(), metrics.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(IDLE)
                .serve_connection(TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    config: Arc<InjectConfig>,
    metrics: WebhookMetrics,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let scope = match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return Ok(reply(StatusCode::OK, "ok\n".into())),
        (&Method::POST, "/inject/namespace") => Scope::Namespace,
        (&Method::POST, "/inject/pod") => Scope::Pod,
        _ => return Ok(reply(StatusCode::NOT_FOUND, "POST /inject/namespace or /inject/pod\n".into())),
    };
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            metrics.count("invalid");
            return Ok(reply(StatusCode::PAYLOAD_TOO_LARGE, format!("cannot read the request: {e}\n")));
        }
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            metrics.count("invalid");
            return Ok(reply(StatusCode::BAD_REQUEST, format!("not JSON: {e}\n")));
        }
    };
    match review(&request, scope, &config) {
        Ok((response, verdict)) => {
            let pod = &request["request"]["object"]["metadata"];
            let name = pod["name"].as_str().or(pod["generateName"].as_str()).unwrap_or("");
            let namespace = request["request"]["namespace"].as_str().unwrap_or("");
            match &verdict {
                Verdict::Patch(ops) => {
                    metrics.count("injected");
                    tracing::info!(namespace, pod = name, ops = ops.len(), "injected");
                }
                Verdict::Unchanged(why) => {
                    metrics.count("unchanged");
                    tracing::info!(namespace, pod = name, "unchanged: {why}");
                }
                Verdict::Refuse(why) => {
                    metrics.count("refused");
                    tracing::warn!(namespace, pod = name, "refused: {why}");
                }
            }
            let mut r = reply(StatusCode::OK, response.to_string());
            r.headers_mut()
                .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
            Ok(r)
        }
        Err(e) => {
            metrics.count("invalid");
            Ok(reply(StatusCode::BAD_REQUEST, format!("{e}\n")))
        }
    }
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// A certificate and key read from files, re-read when either file's modification time changes.
#[derive(Debug)]
struct FileCert {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<(Option<SystemTime>, Arc<CertifiedKey>)>,
}

impl FileCert {
    fn load(cert: PathBuf, key: PathBuf) -> Result<Self, WebhookError> {
        let stamp = modified(&cert, &key);
        let ck =
            read_pair(&cert, &key).map_err(|why| WebhookError::Tls { cert: cert.clone(), key: key.clone(), why })?;
        Ok(Self { cert, key, current: Mutex::new((stamp, Arc::new(ck))) })
    }

    fn error(&self, why: String) -> WebhookError {
        WebhookError::Tls { cert: self.cert.clone(), key: self.key.clone(), why }
    }
}

impl ResolvesServerCert for FileCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let stamp = modified(&self.cert, &self.key);
        if stamp != current.0 {
            match read_pair(&self.cert, &self.key) {
                Ok(ck) => {
                    tracing::info!(cert = %self.cert.display(), "certificate reloaded");
                    *current = (stamp, Arc::new(ck));
                }
                // Half-written files during a renewal: keep serving the old pair and retry.
                Err(why) => tracing::warn!(cert = %self.cert.display(), "certificate not reloaded: {why}"),
            }
        }
        Some(current.1.clone())
    }
}

fn modified(cert: &Path, key: &Path) -> Option<SystemTime> {
    let a = std::fs::metadata(cert).and_then(|m| m.modified()).ok()?;
    let b = std::fs::metadata(key).and_then(|m| m.modified()).ok()?;
    Some(a.max(b))
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read the certificate: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("bad certificate PEM: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the file".into());
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("cannot read the key: {e}"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("unusable key: {e}"))?;
    Ok(CertifiedKey::new(chain, signer))
}
