//! The explicit listener: `CONNECT host:port` tunnels and absolute-form HTTP/1.1 requests, on
//! hyper. A CONNECT tunnel is checked against the ClientHello that follows (domain fronting),
//! then spliced; absolute-form requests are forwarded with hop-by-hop headers removed and
//! upstream connections kept alive per client connection.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use sandgate_policy::{CompiledPolicy, Decision, Host, ProfileId, Reason, Verdict};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::error::ProxyError;
use crate::identity::{AuthError, Credential};
use crate::log::{ConnRecord, Listener, redact_path};
use crate::shared::{ConnGuard, Refusal, Shared, denial_message, raw_response};
use crate::sni;
use crate::tunnel::{self, TunnelError};

pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Header carrying the reason of a denial, for agents and scripts.
const REASON_HEADER: &str = "x-sandgate-reason";
/// TLS alert record: fatal access_denied (RFC 8446 §6), sent before closing a refused tunnel.
pub(crate) const TLS_ALERT_ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];
/// Headers that describe one hop and are never forwarded (RFC 9110 §7.6.1), plus the proxy's
/// own authentication.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// One client connection's state across its requests.
struct ExplicitConn {
    shared: Arc<Shared>,
    client: SocketAddr,
    guard: Arc<ConnGuard>,
    upstream: Mutex<Option<CachedUpstream>>,
}

/// A kept-alive upstream HTTP connection and the destination it was vetted for.
struct CachedUpstream {
    host: Host,
    port: u16,
    addr: SocketAddr,
    sender: SendRequest<Counted<Incoming>>,
}

/// Serves one explicit-proxy client connection until it closes or becomes a tunnel.
///
/// The first request head is read here: a CONNECT (nearly all traffic: HTTPS) is answered and
/// tunnelled directly, without hyper, so a tunnel costs no HTTP machinery and keeps no buffer.
/// Anything else is handed to hyper with the bytes already read replayed in front.
pub(crate) async fn serve(shared: Arc<Shared>, mut stream: TcpStream, client: SocketAddr, guard: ConnGuard) {
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    match read_first_head(&mut stream, &mut buf, &shared.limits).await {
        FirstHead::Connect { authority, cred, len } => {
            connect_fast(&shared, stream, client, buf, len, &authority, cred, guard).await;
        }
        FirstHead::Failed(error) => {
            let policy = shared.policy();
            let mut rec = shared.record(Listener::Explicit, client);
            if let Some(status) = match error {
                ProxyError::HeaderTooLarge(_) => Some("431 Request Header Fields Too Large"),
                ProxyError::HeaderTimeout => Some("408 Request Timeout"),
                _ => None,
            } {
                let body = format!("sandgate: {error}\n");
                let _ = stream.write_all(raw_response(status, error.as_label(), &body).as_bytes()).await;
            }
            rec.fail(&error);
            rec.finish(&policy, &shared.metrics);
        }
        // Boxed: hyper's connection future is large and most connections are CONNECT tunnels.
        FirstHead::Request(head) if deny_fast(&shared, &mut stream, client, &head).await => {}
        FirstHead::Request(_) | FirstHead::Other => {
            Box::pin(serve_http(shared, Prefixed { prefix: buf.freeze(), inner: stream }, client, guard)).await;
        }
    }
}

/// The destination of an absolute-form request: host, port and the authority as written.
fn http_target(uri: &Uri) -> Result<(Host, u16, http::uri::Authority), ProxyError> {
    let Some(authority) = uri.authority().cloned() else {
        return Err(ProxyError::MalformedRequest(
            "sandgate is a proxy: send absolute-form requests (GET http://host/) or CONNECT",
        ));
    };
    if uri.scheme_str() != Some("http") {
        return Err(ProxyError::MalformedRequest("only http:// is forwarded; use CONNECT for https"));
    }
    let host =
        Host::parse(authority.host()).map_err(|_| ProxyError::MalformedRequest("request host is not a host name"))?;
    Ok((host, authority.port_u16().unwrap_or(80), authority))
}

/// Answers a first request the policy denies by its host alone, without hyper; `false` when
/// the request must go to hyper (allowed, report mode, or not a plain absolute-form request).
async fn deny_fast(shared: &Shared, stream: &mut TcpStream, client: SocketAddr, head: &RequestHead) -> bool {
    let Ok(uri) = head.target.parse::<Uri>() else { return false };
    let Ok((host, port, _)) = http_target(&uri) else { return false };
    let policy = shared.policy();
    // Unauthenticated requests are answered (407) on the hyper path.
    let Ok(profile) = shared.authorize(&policy, client.ip(), head.cred.as_ref()) else { return false };
    let d = policy.decide(profile, &host, port);
    if d.verdict.proceeds() {
        return false;
    }
    let mut rec = shared.record(Listener::Explicit, client);
    if let Some(c) = &head.cred {
        rec.sandbox = Some(c.user.clone());
    }
    rec.method = Some(head.method.clone());
    rec.path = uri.path_and_query().map(|p| redact_path(p.as_str()));
    rec.host = Some(host.to_string());
    rec.port = port;
    rec.decision = Some(d);
    let body = denial_message(&policy, &host.to_string(), port, &d);
    let _ = stream.write_all(raw_response("403 Forbidden", d.reason.as_str(), &body).as_bytes()).await;
    rec.finish(&policy, &shared.metrics);
    true
}

/// Bytes read before the first request head is complete.
const FIRST_READ: usize = 1024;
/// Headers parsed in a first request head; more is a malformed request for a proxy.
const MAX_HEADERS: usize = 64;

/// The parts of a first request head that a denial needs.
struct RequestHead {
    method: String,
    target: String,
    cred: Option<Credential>,
}

/// What the first request head on a connection is.
enum FirstHead {
    /// `CONNECT authority`; `len` is the head's length in the buffer.
    Connect { authority: String, cred: Option<Credential>, len: usize },
    /// Another request: hyper answers it (after `deny_fast` had its look).
    Request(RequestHead),
    /// Unparsable or closed: hyper answers it.
    Other,
    /// Too large or too slow.
    Failed(ProxyError),
}

async fn read_first_head(stream: &mut TcpStream, buf: &mut BytesMut, limits: &crate::Limits) -> FirstHead {
    let deadline = tokio::time::Instant::now() + limits.header_timeout;
    loop {
        match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
            Err(_) => return FirstHead::Failed(ProxyError::HeaderTimeout),
            Ok(Ok(0)) | Ok(Err(_)) => return FirstHead::Other,
            Ok(Ok(_)) => {}
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(buf) {
            Ok(httparse::Status::Complete(len)) => {
                let cred = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
                    .and_then(|h| std::str::from_utf8(h.value).ok())
                    .and_then(Credential::from_basic);
                let target = req.path.unwrap_or("").to_owned();
                return match req.method {
                    Some("CONNECT") => FirstHead::Connect { authority: target, cred, len },
                    method => FirstHead::Request(RequestHead { method: method.unwrap_or("").to_owned(), target, cred }),
                };
            }
            Ok(httparse::Status::Partial) if buf.len() >= limits.max_header_bytes => {
                return FirstHead::Failed(ProxyError::HeaderTooLarge(limits.max_header_bytes));
            }
            Ok(httparse::Status::Partial) => {}
            // hyper answers malformed heads with its own 400 and the log records why.
            Err(_) => return FirstHead::Other,
        }
    }
}

/// Answers a first-request CONNECT and runs its tunnel.
#[expect(clippy::too_many_arguments, reason = "one call site; a struct would only rename them")]
async fn connect_fast(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    client: SocketAddr,
    buf: BytesMut,
    head_len: usize,
    authority: &str,
    cred: Option<Credential>,
    guard: ConnGuard,
) {
    let policy = shared.policy();
    let mut rec = shared.record(Listener::Explicit, client);
    let authorized = shared.authorize(&policy, client.ip(), cred.as_ref());
    if let Some(c) = cred {
        rec.sandbox = Some(c.user);
    }
    let profile = match authorized {
        Ok(p) => p,
        Err(e) => {
            let _ = stream.write_all(proxy_auth_required(e).as_bytes()).await;
            rec.fail(&ProxyError::ProxyAuth(e));
            return rec.finish(&policy, &shared.metrics);
        }
    };
    let parsed =
        authority.parse::<http::uri::Authority>().ok().and_then(|a| Some((Host::parse(a.host()).ok()?, a.port_u16()?)));
    let Some((host, port)) = parsed else {
        let e = ProxyError::MalformedRequest("CONNECT needs host:port");
        let _ = stream
            .write_all(raw_response("400 Bad Request", e.as_label(), &format!("sandgate: {e}\n")).as_bytes())
            .await;
        rec.fail(&e);
        return rec.finish(&policy, &shared.metrics);
    };
    rec.host = Some(host.to_string());
    rec.port = port;
    // Boxed: the resolver's future is large and lives only while the tunnel is set up.
    match Box::pin(shared.open_upstream(&policy, &mut rec, profile, &host, port)).await {
        Ok(upstream) => {
            if let Err(e) = stream.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await {
                rec.fail(&ProxyError::Io(e));
                return rec.finish(&policy, &shared.metrics);
            }
            // Bytes the client sent after the head (a pipelined ClientHello) go first; copied so
            // the head's buffer is freed now rather than held for the tunnel's life.
            let early = match buf.get(head_len..) {
                Some(rest) if !rest.is_empty() => BytesMut::from(rest),
                _ => BytesMut::new(),
            };
            drop(buf);
            // The tunnel gets a task of its own, sized for the tunnel alone: the set-up
            // task's larger state is freed now instead of being held for the tunnel's life.
            let shared = shared.clone();
            tokio::spawn(async move {
                let _guard = guard;
                after_connect(&shared, policy, stream, early, upstream, rec, profile, host).await;
            });
        }
        Err(Refusal::Denied(d)) => {
            let body = denial_message(&policy, &host.to_string(), port, &d);
            let _ = stream.write_all(raw_response("403 Forbidden", d.reason.as_str(), &body).as_bytes()).await;
            rec.finish(&policy, &shared.metrics);
        }
        Err(Refusal::Failed(e)) => {
            let status = match e.status() {
                504 => "504 Gateway Timeout",
                503 => "503 Service Unavailable",
                400 => "400 Bad Request",
                _ => "502 Bad Gateway",
            };
            let _ = stream.write_all(raw_response(status, e.as_label(), &format!("sandgate: {e}\n")).as_bytes()).await;
            rec.fail(&e);
            rec.finish(&policy, &shared.metrics);
        }
    }
}

/// Serves absolute-form HTTP (and any later CONNECT) on hyper, with keep-alive.
async fn serve_http(shared: Arc<Shared>, io: Prefixed, client: SocketAddr, guard: ConnGuard) {
    let limits = shared.limits.clone();
    let conn =
        Arc::new(ExplicitConn { shared: shared.clone(), client, guard: Arc::new(guard), upstream: Mutex::new(None) });
    let served = Arc::new(AtomicU64::new(0));
    let served2 = served.clone();
    let service = hyper::service::service_fn(move |req| {
        served2.fetch_add(1, Ordering::Relaxed);
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(conn.handle(req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    let result = builder.serve_connection(TokioIo::new(io), service).with_upgrades().await;
    if let Err(e) = result {
        // hyper has already answered 400/431 where it could; record why the connection ended.
        let error = if e.is_timeout() {
            Some(ProxyError::HeaderTimeout)
        } else if e.is_parse_too_large() {
            Some(ProxyError::HeaderTooLarge(limits.max_header_bytes))
        } else if e.is_parse() {
            Some(ProxyError::MalformedRequest("unparsable request head"))
        } else if served.load(Ordering::Relaxed) == 0 && !e.is_incomplete_message() {
            Some(ProxyError::MalformedRequest("connection failed before a request"))
        } else {
            None
        };
        if let Some(error) = error {
            let policy = shared.policy();
            let mut rec = shared.record(Listener::Explicit, client);
            rec.fail(&error);
            rec.finish(&policy, &shared.metrics);
        }
    }
}

// === impl ExplicitConn ===

impl ExplicitConn {
    async fn handle(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        let policy = self.shared.policy();
        let mut rec = self.shared.record(Listener::Explicit, self.client);
        let cred = req
            .headers()
            .get(header::PROXY_AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(Credential::from_basic);
        let authorized = self.shared.authorize(&policy, self.client.ip(), cred.as_ref());
        if let Some(c) = cred {
            rec.sandbox = Some(c.user);
        }
        let profile = match authorized {
            Ok(p) => p,
            Err(e) => {
                let mut r = text_response(
                    StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                    e.as_label(),
                    format!("sandgate: {}\n", e.describe()),
                );
                r.headers_mut()
                    .insert(header::PROXY_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"sandgate\""));
                rec.fail(&ProxyError::ProxyAuth(e));
                rec.finish(&policy, &self.shared.metrics);
                return r;
            }
        };
        if req.method() == Method::CONNECT {
            self.connect(req, policy, rec, profile).await
        } else {
            self.forward(req, policy, rec, profile).await
        }
    }

    async fn connect(
        &self,
        req: Request<Incoming>,
        policy: Arc<CompiledPolicy>,
        mut rec: Box<ConnRecord>,
        profile: ProfileId,
    ) -> Response<ProxyBody> {
        let Some((host, port)) = req.uri().authority().and_then(|a| Some((a.host(), a.port_u16()?))) else {
            return self.fail(&policy, rec, ProxyError::MalformedRequest("CONNECT needs host:port"));
        };
        let host = match Host::parse(host) {
            Ok(h) => h,
            Err(_) => return self.fail(&policy, rec, ProxyError::MalformedRequest("CONNECT host is not a host name")),
        };
        rec.host = Some(host.to_string());
        rec.port = port;
        let upstream = match Box::pin(self.shared.open_upstream(&policy, &mut rec, profile, &host, port)).await {
            Ok(s) => s,
            Err(Refusal::Denied(d)) => return self.deny(&policy, rec, &d),
            Err(Refusal::Failed(e)) => return self.fail(&policy, rec, e),
        };
        let on_upgrade = hyper::upgrade::on(req);
        let shared = self.shared.clone();
        let guard = self.guard.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let parts = match on_upgrade.await.map(|u| u.downcast::<TokioIo<Prefixed>>()) {
                Ok(Ok(parts)) => parts,
                Ok(Err(_)) | Err(_) => {
                    rec.fail(&ProxyError::MalformedRequest("CONNECT upgrade failed"));
                    rec.finish(&policy, &shared.metrics);
                    return;
                }
            };
            let Prefixed { prefix, inner: client } = parts.io.into_inner();
            let mut early = BytesMut::with_capacity(prefix.len() + parts.read_buf.len());
            early.extend_from_slice(&prefix);
            early.extend_from_slice(&parts.read_buf);
            drop((prefix, parts.read_buf));
            after_connect(&shared, policy, client, early, upstream, rec, profile, host).await;
        });
        Response::new(empty())
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
        policy: Arc<CompiledPolicy>,
        mut rec: Box<ConnRecord>,
        profile: ProfileId,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = req.into_parts();
        rec.method = Some(parts.method.as_str().to_owned());
        rec.path = parts.uri.path_and_query().map(|p| redact_path(p.as_str()));
        let (host, port, authority) = match http_target(&parts.uri) {
            Ok(t) => t,
            Err(e) => return self.fail(&policy, rec, e),
        };
        rec.host = Some(host.to_string());
        rec.port = port;

        let mut sender = match self.upstream_for(&policy, &mut rec, profile, &host, port).await {
            Ok(s) => s,
            Err(Refusal::Denied(d)) => return self.deny(&policy, rec, &d),
            Err(Refusal::Failed(e)) => return self.fail(&policy, rec, e),
        };

        strip_hop_by_hop(&mut parts.headers);
        parts.uri = match parts.uri.path_and_query() {
            Some(pq) => Uri::builder().path_and_query(pq.clone()).build().unwrap_or_else(|_| Uri::from_static("/")),
            None => Uri::from_static("/"),
        };
        // The authority the proxy vetted is the one the origin sees: no Host-header fronting.
        if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(header::HOST, v);
        }
        let up = Arc::new(AtomicU64::new(0));
        let body = Counted { inner: body, count: up.clone(), done: None };
        let response = match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(r) => r,
            Err(e) => return self.fail(&policy, rec, ProxyError::UpstreamHttp(e.to_string())),
        };
        if let Some(dialled) = rec.dialled {
            self.keep(host, port, dialled, sender);
        }
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let finisher = Finisher { rec: Some(rec), up, policy, shared: self.shared.clone() };
        let body = Counted { inner: body, count: Arc::new(AtomicU64::new(0)), done: Some(finisher) };
        Response::from_parts(parts, body.boxed())
    }

    /// An upstream HTTP sender for the destination: the kept-alive one if it still fits the
    /// policy, else a new connection.
    async fn upstream_for(
        &self,
        policy: &CompiledPolicy,
        rec: &mut ConnRecord,
        profile: ProfileId,
        host: &Host,
        port: u16,
    ) -> Result<SendRequest<Counted<Incoming>>, Refusal> {
        let cached = self.upstream.lock().ok().and_then(|mut c| c.take());
        if let Some(mut c) = cached
            && c.host == *host
            && c.port == port
        {
            let d = policy.decide(profile, host, port);
            rec.decision = Some(d);
            if !d.verdict.proceeds() {
                return Err(Refusal::Denied(d));
            }
            // Re-vet the kept address: the policy may have been reloaded since it was dialled.
            let permit = policy.vet(&d, &[c.addr.ip()], port).map_err(|d| {
                rec.decision = Some(d);
                Refusal::Denied(d)
            })?;
            rec.decision = Some(*permit.decision());
            if c.sender.ready().await.is_ok() {
                rec.dialled = Some(c.addr);
                return Ok(c.sender);
            }
        }
        let stream = self.shared.open_upstream(policy, rec, profile, host, port).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Refusal::Failed(ProxyError::UpstreamHttp(e.to_string())))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    fn keep(&self, host: Host, port: u16, addr: SocketAddr, sender: SendRequest<Counted<Incoming>>) {
        if let Ok(mut slot) = self.upstream.lock() {
            *slot = Some(CachedUpstream { host, port, addr, sender });
        }
    }

    fn deny(&self, policy: &CompiledPolicy, rec: Box<ConnRecord>, d: &Decision) -> Response<ProxyBody> {
        let host = rec.host.clone().unwrap_or_default();
        let body = denial_message(policy, &host, rec.port, d);
        let reason = d.reason.as_str();
        rec.finish(policy, &self.shared.metrics);
        text_response(StatusCode::FORBIDDEN, reason, body)
    }

    fn fail(&self, policy: &CompiledPolicy, mut rec: Box<ConnRecord>, e: ProxyError) -> Response<ProxyBody> {
        rec.fail(&e);
        let body = format!("sandgate: {e}\n");
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
        rec.finish(policy, &self.shared.metrics);
        let mut r = text_response(status, e.as_label(), body);
        // After a malformed request the connection's framing cannot be trusted: close it.
        if e.side() == crate::Side::Client {
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}

/// After `200 Connection established`: hosts a credential or git rule names are intercepted;
/// every other host is a tunnel Sandgate never decrypts.
#[expect(clippy::too_many_arguments, reason = "one call site per listener; a struct would only rename them")]
pub(crate) async fn after_connect(
    shared: &Arc<Shared>,
    policy: Arc<CompiledPolicy>,
    client: TcpStream,
    early: BytesMut,
    upstream: TcpStream,
    mut rec: Box<ConnRecord>,
    profile: ProfileId,
    host: Host,
) {
    let Host::Name(name) = &host else {
        return tunnel_after_connect(shared, &policy, client, early, upstream, rec, profile, &host).await;
    };
    if !policy.intercepts(name) {
        return tunnel_after_connect(shared, &policy, client, early, upstream, rec, profile, &host).await;
    }
    match shared.interceptor.clone() {
        Some(icpt) => {
            let port = rec.port;
            Box::pin(crate::intercept::serve(
                shared.clone(),
                icpt,
                policy,
                client,
                early,
                upstream,
                rec,
                profile,
                name.clone(),
                port,
            ))
            .await;
        }
        None => {
            // Fail closed: a plain tunnel would skip the git rules and the credential.
            rec.fail(&ProxyError::Credential(
                "the policy intercepts this host but no CA is loaded; start the proxy with --vault holding `sandgate ca init`'s CA".into(),
            ));
            rec.finish(&policy, &shared.metrics);
        }
    }
}

/// After `200 Connection established`: checks the ClientHello against the CONNECT host (if
/// the client speaks first), then splices.
#[expect(clippy::too_many_arguments, reason = "one call site; a struct would only rename them")]
pub(crate) async fn tunnel_after_connect(
    shared: &Shared,
    policy: &CompiledPolicy,
    mut client: TcpStream,
    mut buf: BytesMut,
    mut upstream: TcpStream,
    mut rec: Box<ConnRecord>,
    profile: ProfileId,
    host: &Host,
) {
    if buf.is_empty() {
        // Whoever speaks first decides: a client-first protocol gets its ClientHello checked,
        // a server-first one (SSH, SMTP) is relayed as it is.
        // Polled by hand: readiness is registered without storing two readiness futures in
        // every waiting tunnel.
        let mut timer = std::pin::pin!(tokio::time::sleep(shared.limits.idle_timeout));
        std::future::poll_fn(|cx| {
            let woke = client.poll_read_ready(cx).is_ready()
                | upstream.poll_read_ready(cx).is_ready()
                | timer.as_mut().poll(cx).is_ready();
            if woke { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        })
        .await;
        buf.reserve(4096);
        if let Err(e) = client.try_read_buf(&mut buf)
            && e.kind() != std::io::ErrorKind::WouldBlock
        {
            rec.fail(&ProxyError::Io(e));
            rec.finish(policy, &shared.metrics);
            return;
        }
    }
    if buf.first().is_some_and(|b| sni::looks_like_tls(*b)) {
        match Box::pin(read_hello(&mut client, &mut buf, &shared.limits)).await {
            Ok(()) => {}
            Err(e) => {
                rec.fail(&e);
                rec.finish(policy, &shared.metrics);
                return;
            }
        }
        if let Some(refusal) = check_hello(policy, profile, host, &buf, &mut rec) {
            rec.decision = Some(refusal);
            if refusal.verdict == Verdict::Deny {
                let _ = client.write_all(&TLS_ALERT_ACCESS_DENIED).await;
                rec.finish(policy, &shared.metrics);
                return;
            }
        }
    }
    finish_tunnel(shared, policy, &mut client, &mut upstream, buf, rec).await;
}

/// Reads until `buf` holds a complete ClientHello, within the hello timeout and size limit.
pub(crate) async fn read_hello(
    client: &mut TcpStream,
    buf: &mut BytesMut,
    limits: &crate::Limits,
) -> Result<(), ProxyError> {
    let deadline = tokio::time::Instant::now() + limits.hello_timeout;
    loop {
        match sni::parse(buf) {
            Ok(_) => return Ok(()),
            Err(sni::HelloError::Malformed) => return Err(ProxyError::MalformedHello),
            Err(sni::HelloError::Incomplete) => {}
        }
        if buf.len() >= limits.max_hello_bytes {
            return Err(ProxyError::HelloTooLarge(limits.max_hello_bytes));
        }
        buf.reserve(4096);
        match tokio::time::timeout_at(deadline, client.read_buf(buf)).await {
            Err(_) => return Err(ProxyError::HelloTimeout),
            Ok(Ok(0)) => return Err(ProxyError::MalformedHello),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(ProxyError::Io(e)),
        }
    }
}

/// Checks a complete ClientHello inside a CONNECT tunnel: its SNI must name the CONNECT host
/// (domain fronting otherwise), and ECH is refused when the policy says so. Returns the
/// refusal, if any. An IP-literal CONNECT has no name to compare: its address was vetted.
fn check_hello(
    policy: &CompiledPolicy,
    profile: ProfileId,
    host: &Host,
    buf: &[u8],
    rec: &mut ConnRecord,
) -> Option<Decision> {
    let hello = sni::parse(buf).ok()?;
    rec.sni = hello.server_name.as_deref().map(str::to_owned);
    if hello.ech && policy.refuses_ech() {
        return Some(policy.refuse(profile, Reason::EchRefused));
    }
    if let (Host::Name(expected), Some(sni)) = (host, hello.server_name.as_deref()) {
        let same = sandgate_policy::HostName::parse(sni).is_ok_and(|n| n == *expected);
        if !same {
            return Some(policy.refuse(profile, Reason::SniMismatch));
        }
    }
    None
}

/// Splices an established tunnel to its end and emits the record.
pub(crate) async fn finish_tunnel(
    shared: &Shared,
    policy: &CompiledPolicy,
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    early: BytesMut,
    mut rec: Box<ConnRecord>,
) {
    match tunnel::relay(client, upstream, early, shared.limits.idle_timeout, &shared.pipes).await {
        Ok(t) => {
            rec.up = t.up;
            rec.down = t.down;
        }
        Err(TunnelError::Idle(_, t)) => {
            rec.up = t.up;
            rec.down = t.down;
            rec.fail(&ProxyError::Idle);
        }
        Err(TunnelError::Io { source, moved }) => {
            rec.up = moved.up;
            rec.down = moved.down;
            // A reset after data flowed is how many clients end; it is not worth an error.
            if !matches!(source.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) {
                rec.fail(&ProxyError::Io(source));
            }
        }
    }
    rec.finish(policy, &shared.metrics);
}

/// The 407 answer for a client this proxy does not recognise (node-agent mode).
fn proxy_auth_required(e: AuthError) -> String {
    let body = format!("sandgate: {}\n", e.describe());
    format!(
        "HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic realm=\"sandgate\"\r\ncontent-type: text/plain; charset=utf-8\r\n{REASON_HEADER}: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        e.as_label(),
        body.len()
    )
}

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
}

pub(crate) fn empty() -> ProxyBody {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}

pub(crate) fn text_response(status: StatusCode, reason: &'static str, body: String) -> Response<ProxyBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(REASON_HEADER, HeaderValue::from_static(reason));
    r
}

/// A body that counts its data bytes and, for responses, emits the request's record when it
/// ends or is dropped.
pub(crate) struct Counted<B> {
    pub(crate) inner: B,
    pub(crate) count: Arc<AtomicU64>,
    pub(crate) done: Option<Finisher>,
}

/// Emits a request's record when its response body ends (or is dropped).
pub(crate) struct Finisher {
    pub(crate) rec: Option<Box<ConnRecord>>,
    pub(crate) up: Arc<AtomicU64>,
    pub(crate) policy: Arc<CompiledPolicy>,
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Finisher {
    fn drop(&mut self) {
        if let Some(mut rec) = self.rec.take() {
            rec.up = self.up.load(Ordering::Relaxed);
            rec.finish(&self.policy, &self.shared.metrics);
        }
    }
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let n = data.len() as u64;
            this.count.fetch_add(n, Ordering::Relaxed);
            if let Some(f) = this.done.as_mut()
                && let Some(rec) = f.rec.as_mut()
            {
                rec.down += n;
            }
        }
        if let Poll::Ready(None) = &polled {
            this.done = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client stream with bytes already read from it put back in front, so hyper sees the
/// connection from its first byte.
pub(crate) struct Prefixed {
    pub(crate) prefix: Bytes,
    pub(crate) inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
