//! A git smart-HTTP server: `git http-backend` run as CGI behind a small hyper server on
//! `127.0.0.1:0`, serving bare repositories under a temporary root; and a git client runner
//! with a clean environment (no global config, no credentials, no preset proxies).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// A running git server; stops when dropped.
pub(crate) struct GitServer {
    pub(crate) addr: SocketAddr,
    pub(crate) root: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs git with a clean environment in `dir`.
pub(crate) fn git(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new("git");
    super::without_preset_proxies(&mut c)
        .current_dir(dir)
        .args(args)
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_SSL_CAINFO")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.test")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.test");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("git is installed")
}

/// Asserts a git command succeeded, showing its output if not.
pub(crate) fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts a server with one bare repository, `repo.git`, holding one commit.
pub(crate) async fn server() -> GitServer {
    server_with(&["repo.git"], None, None).await
}

/// Starts a server with bare repositories at `repos` (e.g. `org/app.git`), over TLS when
/// `tls` is given, demanding `Authorization: <required>` (401 otherwise) when it is given and
/// recording every Authorization value it sees in `seen`.
pub(crate) async fn server_with(
    repos: &[&str],
    tls: Option<tokio_rustls::TlsAcceptor>,
    required: Option<(String, super::origin::Seen)>,
) -> GitServer {
    let root = tempfile::tempdir().unwrap();
    let seed = root.path().join("seed");
    std::fs::create_dir(&seed).unwrap();
    ok(&git(&seed, &["init", "-q", "-b", "main"], &[]), "init");
    std::fs::write(seed.join("README"), "hello from the origin\n").unwrap();
    ok(&git(&seed, &["add", "README"], &[]), "add");
    ok(&git(&seed, &["commit", "-q", "-m", "first"], &[]), "commit");
    for repo in repos {
        let dest = root.path().join(repo);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        ok(&git(root.path(), &["clone", "-q", "--bare", "seed", dest.to_str().unwrap()], &[]), "bare clone");
        ok(&git(&dest, &["config", "http.receivepack", "true"], &[]), "config");
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let project_root = root.path().to_owned();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let project_root = project_root.clone();
            let (tls, required) = (tls.clone(), required.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let root = project_root.clone();
                    let required = required.clone();
                    async move {
                        if let Some((want, seen)) = &required {
                            let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("-");
                            seen.lock().unwrap().push(auth.to_owned());
                            if auth != want {
                                let mut r = Response::new(Full::new(Bytes::from_static(b"auth required")));
                                *r.status_mut() = StatusCode::UNAUTHORIZED;
                                r.headers_mut()
                                    .insert("www-authenticate", http::HeaderValue::from_static("Basic realm=\"git\""));
                                return Ok::<_, Infallible>(r);
                            }
                        }
                        Ok::<_, Infallible>(cgi(&root, req).await)
                    }
                });
                super::origin::serve_http1(stream, tls, service).await;
            });
        }
    });
    GitServer { addr, root, task }
}

async fn cgi(root: &PathBuf, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let exec_path = Command::new("git").arg("--exec-path").output().unwrap();
    let backend = PathBuf::from(String::from_utf8_lossy(&exec_path.stdout).trim()).join("git-http-backend");
    let mut child = tokio::process::Command::new(backend)
        .env_clear()
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", "agent")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&body).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let raw = out.stdout;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    let split = split.or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((end, sep)) = split else {
        let mut r = Response::new(Full::new(Bytes::from_static(b"bad CGI output")));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return r;
    };
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(&raw[end + sep..])));
    for line in String::from_utf8_lossy(&raw[..end]).lines() {
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            let code = v.split(' ').next().and_then(|c| c.parse().ok()).unwrap_or(500);
            *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else if let (Ok(k), Ok(v)) = (http::HeaderName::from_bytes(k.as_bytes()), http::HeaderValue::from_str(v)) {
            response.headers_mut().append(k, v);
        }
    }
    response
}
