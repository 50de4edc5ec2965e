//! The credential broker end to end: Sandgate's CA from `sandgate ca init`, secrets from
//! `sandgate secret set`, real origins behind their own CA, and real clients (curl over HTTP/1.1
//! and HTTP/2, git over HTTPS) that hold no token. A canary token must appear in no log line,
//! metric, diagnostic or response.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use base64::Engine;

use super::loopback_policy;
use crate::support::git::{self, git, ok};
use crate::support::proxy::{ProxyProc, sandgate_bin};
use crate::support::{curl, origin, pki::Pki, proxy};

const CANARY: &str = "ghp_CANARYcanaryCANARY0123456789abcdef";
const PLACEHOLDER: &str = "ghp_PLACEHOLDER_not_a_real_token_000";

/// A vault with Sandgate's CA and the given secrets, made with the real command line.
pub(crate) struct Broker {
    dir: tempfile::TempDir,
    pub(crate) ca: PathBuf,
}

impl Broker {
    pub(crate) fn new(secrets: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let b = Self { ca: dir.path().join("sandgate-ca.pem"), dir };
        let out = b.cmd(&["ca", "init"]).output().unwrap();
        assert!(out.status.success(), "ca init: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(&b.ca, &out.stdout).unwrap();
        for (name, value) in secrets {
            let mut child = b.cmd(&["secret", "set", name]).stdin(Stdio::piped()).spawn().unwrap();
            child.stdin.take().unwrap().write_all(value.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success());
        }
        b
    }

    pub(crate) fn vault(&self) -> PathBuf {
        self.dir.path().join("vault.json")
    }

    pub(crate) fn key(&self) -> PathBuf {
        self.dir.path().join("vault.key")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(sandgate_bin());
        c.args(args)
            .arg("--vault")
            .arg(self.vault())
            .arg("--key-file")
            .arg(self.key())
            .env_remove("SANDGATE_VAULT_KEY");
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    fn proxy(&self, policy: &str, origin_ca: &Pki) -> ProxyProc {
        let (v, k, o) = (self.vault(), self.key(), origin_ca.ca_path.clone());
        proxy::new(policy)
            .args(&[
                "--vault",
                v.to_str().unwrap(),
                "--vault-key-file",
                k.to_str().unwrap(),
                "--upstream-ca",
                o.to_str().unwrap(),
            ])
            .start()
    }
}

fn basic(user: &str, secret: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}")))
}

/// Fails if the canary appears anywhere the proxy wrote.
fn assert_no_canary(p: &ProxyProc, responses: &[&str]) {
    let logs = serde_json::to_string(&p.logs()).unwrap();
    let diag = p.diag().join("\n");
    let metrics = p.metrics();
    for (what, text) in [("log", logs.as_str()), ("diagnostics", diag.as_str()), ("metrics", metrics.as_str())] {
        assert!(!text.contains(CANARY), "the canary leaked into the {what}: {text}");
    }
    for r in responses {
        assert!(!r.contains(CANARY), "the canary leaked into a response: {r}");
    }
}

fn credential_policy(ports: &[u16], extra: &str) -> String {
    format!(
        "{}credentials:
  - name: origin-token
    hosts: [origin.test]
    secret: origin-token
    username: x-access-token
    placeholder: {PLACEHOLDER}
  - name: git-token
    hosts: [git.test]
    secret: git-token
    username: x-access-token
{extra}",
        loopback_policy(ports)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intercepted_requests_get_the_credential_over_http1_and_http2() {
    let pki = Pki::new();
    let (o, seen) = origin::https_recording("tls", &pki, &["origin.test"]).await;
    let port = o.addr.port();
    let b = Broker::new(&[("origin-token", CANARY), ("git-token", "unused-git-token")]);
    let p = b.proxy(&credential_policy(&[port], ""), &pki);
    let ca = b.ca.to_str().unwrap();
    let url = format!("https://origin.test:{port}/api");
    let mut responses = Vec::new();
    for (proto, flag) in [("HTTP/1.1", "--http1.1"), ("HTTP/2", "--http2")] {
        let (code, body, err) = curl(&[
            "-x",
            &p.url(),
            "--cacert",
            ca,
            flag,
            "-D",
            "-",
            "-H",
            "Authorization: Bearer sandbox-own-token",
            &url,
        ]);
        assert_eq!(code, 200, "{proto}: {body}{err}");
        // The dump starts with the proxy's CONNECT answer, then the intercepted response.
        let after_connect = body.split_once("\r\n\r\n").map_or("", |(_, rest)| rest);
        assert!(after_connect.starts_with(&format!("{proto} 200")), "{proto} spoken to the sandbox: {body}");
        assert!(body.contains("origin tls GET /api"), "{body}");
        responses.push(body);
    }
    let want = basic("x-access-token", CANARY);
    assert_eq!(*seen.lock().unwrap(), vec![want.clone(), want], "the origin saw exactly the configured credential");
    let log = p.wait_log("intercepted request", |v| v["intercepted"] == true && v["credential"] == "origin-token");
    assert_eq!(log["method"], "GET");
    assert_eq!(log["path"], "/api");
    assert_eq!(p.metric("sandgate_proxy_credentials_injected_total", &[("credential", "origin-token")]), 2.0);
    let refs: Vec<&str> = responses.iter().map(String::as_str).collect();
    assert_no_canary(&p, &refs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_over_https_with_no_token_in_the_sandbox_and_repo_scoped_push() {
    let pki = Pki::new();
    let seen: origin::Seen = Default::default();
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config(&["git.test"]));
    let server = git::server_with(
        &["org/app.git", "org/other.git"],
        Some(tls),
        Some((basic("x-access-token", CANARY), seen.clone())),
    )
    .await;
    let port = server.addr.port();
    let b = Broker::new(&[("origin-token", "unused-origin-token"), ("git-token", CANARY)]);
    let rules = "git:\n  - hosts: [git.test]\n    fetch: [\"org/*\"]\n    push: [org/app]\n";
    let p = b.proxy(&credential_policy(&[port], rules), &pki);
    let work = tempfile::tempdir().unwrap();
    let proxy_url = p.url();
    let ca = b.ca.to_str().unwrap().to_owned();
    let env = [("https_proxy", proxy_url.as_str()), ("GIT_SSL_CAINFO", ca.as_str())];

    // Clone and push with no credential anywhere in the sandbox's environment or config.
    let url = format!("https://git.test:{port}/org/app.git");
    ok(&git(work.path(), &["clone", "-q", &url, "app"], &env), "clone through the broker");
    let app = work.path().join("app");
    std::fs::write(app.join("change.txt"), "agent work\n").unwrap();
    ok(&git(&app, &["add", "change.txt"], &env), "add");
    ok(&git(&app, &["commit", "-q", "-m", "agent change"], &env), "commit");
    ok(&git(&app, &["push", "-q", "origin", "main"], &env), "push to the allowed repository");
    let pushed = git(&server.root.path().join("org/app.git"), &["log", "--format=%s", "-1", "main"], &[]);
    assert_eq!(String::from_utf8_lossy(&pushed.stdout), "agent change\n");

    // Fetching another repository of the org is allowed; pushing to it is not.
    let other_url = format!("https://git.test:{port}/org/other.git");
    ok(&git(work.path(), &["clone", "-q", &other_url, "other"], &env), "clone org/other");
    let other = work.path().join("other");
    std::fs::write(other.join("exfil.txt"), "data\n").unwrap();
    ok(&git(&other, &["add", "exfil.txt"], &env), "add");
    ok(&git(&other, &["commit", "-q", "-m", "exfiltrate"], &env), "commit");
    let refused = git(&other, &["push", "-q", "origin", "main"], &env);
    assert!(!refused.status.success(), "push outside the rule must fail");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("403"), "{stderr}");
    let log = p.wait_log("push refused", |v| v["reason"] == "git_push_not_allowed");
    assert_eq!(log["verdict"], "deny");
    assert!(log["path"].as_str().unwrap().starts_with("/org/other.git/info/refs"), "{log}");

    // Without the broker the same clone fails: the sandbox holds nothing that works.
    let direct = git(work.path(), &["clone", "-q", &url, "direct"], &[("GIT_SSL_CAINFO", ca.as_str())]);
    assert!(!direct.status.success());

    let want = basic("x-access-token", CANARY);
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|a| *a == want),
        "the server saw only the configured credential: {seen:?}"
    );
    assert_no_canary(&p, &[&stderr]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_an_untrusted_certificate_gets_nothing() {
    let trusted = Pki::new();
    let rogue = Pki::new();
    let (o, seen) = origin::https_recording("rogue", &rogue, &["origin.test"]).await;
    let port = o.addr.port();
    let b = Broker::new(&[("origin-token", CANARY), ("git-token", "x-unused-token")]);
    let p = b.proxy(&credential_policy(&[port], ""), &trusted);
    let (code, body, err) =
        curl(&["-x", &p.url(), "--cacert", b.ca.to_str().unwrap(), "-D", "-", &format!("https://origin.test:{port}/")]);
    assert_eq!(code, 502, "{body}{err}");
    assert!(body.contains("x-sandgate-reason: upstream_tls_failed"), "{body}");
    assert!(seen.lock().unwrap().is_empty(), "an unverified origin received a request");
    p.wait_log("bad origin", |v| v["reason"] == "upstream_tls_failed");
    assert_no_canary(&p, &[&body]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_are_swapped_on_their_hosts_and_refused_elsewhere() {
    let pki = Pki::new();
    let (o, seen) = origin::https_recording("tls", &pki, &["origin.test"]).await;
    let (g, git_seen) = origin::https_recording("git", &pki, &["git.test"]).await;
    let b = Broker::new(&[("origin-token", CANARY), ("git-token", "real-git-token-000")]);
    let p = b.proxy(&credential_policy(&[o.addr.port(), g.addr.port()], ""), &pki);
    let ca = b.ca.to_str().unwrap();

    // The sandbox holds only the placeholder, inside a Basic credential as git would send it.
    let sandbox_auth = format!("Authorization: {}", basic("x-access-token", PLACEHOLDER));
    let (code, body, _) = curl(&[
        "-x",
        &p.url(),
        "--cacert",
        ca,
        "-H",
        &sandbox_auth,
        &format!("https://origin.test:{}/", o.addr.port()),
    ]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(*seen.lock().unwrap(), vec![basic("x-access-token", CANARY)], "placeholder swapped for the real token");

    // The same placeholder sent to another intercepted host is refused and never forwarded.
    let (code, body, _) = curl(&[
        "-x",
        &p.url(),
        "--cacert",
        ca,
        "-D",
        "-",
        "-H",
        &format!("X-Token: {PLACEHOLDER}"),
        &format!("https://git.test:{}/", g.addr.port()),
    ]);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("x-sandgate-reason: placeholder_elsewhere"), "{body}");
    assert!(git_seen.lock().unwrap().is_empty(), "the placeholder reached the wrong host");
    p.wait_log("placeholder", |v| v["reason"] == "placeholder_elsewhere" && v["dst_host"] == "git.test");
    assert_no_canary(&p, &[&body]);
}

#[test]
fn a_policy_with_credentials_needs_the_vault_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("p.yaml");
    std::fs::write(&policy, credential_policy(&[443], "")).unwrap();
    let out = Command::new(sandgate_bin())
        .args(["proxy", "--listen", "127.0.0.1:0", "--no-transparent", "--no-admin", "--policy"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pass --vault FILE"), "{err}");
    // A vault without the secret the policy names: refused before binding, the name given.
    let b = Broker::new(&[("origin-token", CANARY)]);
    let out = Command::new(sandgate_bin())
        .args(["proxy", "--listen", "127.0.0.1:0", "--no-transparent", "--no-admin", "--policy"])
        .arg(&policy)
        .arg("--vault")
        .arg(b.vault())
        .arg("--vault-key-file")
        .arg(b.key())
        .env_remove("SANDGATE_VAULT_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("credential `git-token` needs the secret `git-token`"), "{err}");
    assert!(!err.contains(CANARY));
}

/// A TLS connection to `host:port` through the proxy's CONNECT, trusting only the CA in
/// `ca` (Sandgate's), offering `alpn`.
async fn tls_through(
    proxy: std::net::SocketAddr,
    host: &str,
    port: u16,
    ca: &std::path::Path,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, s).await.unwrap()
}

/// An HTTPS origin that accepts a WebSocket upgrade and then echoes raw bytes.
async fn websocket_origin(pki: &Pki) -> std::net::SocketAddr {
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(&["origin.test"]));
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else { return };
                let service = hyper::service::service_fn(|mut req: http::Request<Incoming>| async move {
                    let key = req.headers().get("sec-websocket-key").cloned();
                    let upgrade = hyper::upgrade::on(&mut req);
                    tokio::spawn(async move {
                        if let Ok(up) = upgrade.await {
                            let mut io = TokioIo::new(up);
                            let (mut r, mut w) = tokio::io::split(&mut io);
                            let _ = tokio::io::copy(&mut r, &mut w).await;
                        }
                    });
                    let mut r = http::Response::new(Full::new(bytes::Bytes::new()));
                    *r.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                    r.headers_mut().insert("connection", http::HeaderValue::from_static("upgrade"));
                    r.headers_mut().insert("upgrade", http::HeaderValue::from_static("websocket"));
                    if let Some(k) = key {
                        r.headers_mut().insert("sec-websocket-accept", k);
                    }
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_passes_through_an_intercepted_host() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new();
    let origin = websocket_origin(&pki).await;
    let port = origin.port();
    let b = Broker::new(&[("origin-token", CANARY), ("git-token", "unused-git-token")]);
    let p = b.proxy(&credential_policy(&[port], ""), &pki);

    let mut tls = tls_through(p.explicit, "origin.test", port, &b.ca, &[]).await;
    tls.write_all(
        b"GET /ws HTTP/1.1\r\nHost: origin.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut resp = Vec::new();
    while !resp.ends_with(b"\r\n\r\n") {
        resp.push(tls.read_u8().await.unwrap());
    }
    let resp = String::from_utf8_lossy(&resp).to_lowercase();
    assert!(resp.starts_with("http/1.1 101"), "{resp}");
    assert!(resp.contains("upgrade: websocket"), "{resp}");
    // A masked text frame "hello", echoed back as is through both upgraded connections.
    let frame = [0x81, 0x85, 1, 2, 3, 4, b'h' ^ 1, b'e' ^ 2, b'l' ^ 3, b'l' ^ 4, b'o' ^ 1];
    tls.write_all(&frame).await.unwrap();
    let mut echo = [0u8; 11];
    tokio::time::timeout(std::time::Duration::from_secs(5), tls.read_exact(&mut echo)).await.unwrap().unwrap();
    assert_eq!(echo, frame);
    p.wait_log("websocket", |v| v["path"] == "/ws" && v["credential"] == "origin-token");
}

/// A response body of one data frame then trailers.
struct WithTrailers(Option<hyper::body::Frame<bytes::Bytes>>, Option<http::HeaderMap>);

impl hyper::body::Body for WithTrailers {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        if let Some(f) = self.0.take() {
            return std::task::Poll::Ready(Some(Ok(f)));
        }
        std::task::Poll::Ready(self.1.take().map(|t| Ok(hyper::body::Frame::trailers(t))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_end_to_end_with_trailers_forwarded() {
    use http_body_util::BodyExt;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    // An origin that speaks HTTP/2 (so the broker's origin side is HTTP/2 too) and ends its
    // response with a trailer, as gRPC does.
    let pki = Pki::new();
    let seen: origin::Seen = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config_alpn(&["origin.test"], &[b"h2"]));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), s2.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else { return };
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("-");
                        seen.lock().unwrap().push(format!("{:?} {auth}", req.version()));
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let body = WithTrailers(
                            Some(hyper::body::Frame::data(bytes::Bytes::from_static(b"h2 body"))),
                            Some(trailers),
                        );
                        Ok::<_, std::convert::Infallible>(http::Response::new(body))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let b = Broker::new(&[("origin-token", CANARY), ("git-token", "unused-git-token")]);
    let p = b.proxy(&credential_policy(&[port], ""), &pki);

    // An HTTP/2 client through CONNECT, trusting only Sandgate's CA.
    let tls = tls_through(p.explicit, "origin.test", port, &b.ca, &[b"h2"]).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]), "the broker offers h2 to the sandbox");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(format!("https://origin.test:{port}/svc.Method"))
        .header("authorization", "Bearer sandbox-own")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().expect("trailers forwarded");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(&collected.to_bytes()[..], b"h2 body");
    let want = format!("HTTP/2.0 {}", basic("x-access-token", CANARY));
    assert_eq!(*seen.lock().unwrap(), vec![want], "HTTP/2 to the origin, with the configured credential");
    assert_no_canary(&p, &[]);
}
