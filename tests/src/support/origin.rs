//! Origins on `127.0.0.1:0`: plain HTTP and HTTPS, answering `origin <name> <method> <path>`
//! and echoing the `Host` header they saw, so tests can tell which origin answered.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A running origin; it stops when dropped.
pub(crate) struct Origin {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain-HTTP origin.
pub(crate) async fn http(name: &'static str) -> Origin {
    serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), name, None)
}

/// An HTTPS origin with a leaf for `names` from `pki`.
pub(crate) async fn https(name: &'static str, pki: &super::pki::Pki, names: &[&str]) -> Origin {
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config(names));
    serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), name, Some(tls))
}

/// What an origin saw: the `Authorization` header of each request (`-` when absent), kept in
/// the test process so a secret never has to travel back in a response.
pub(crate) type Seen = Arc<std::sync::Mutex<Vec<String>>>;

/// An HTTPS origin that records the Authorization header of every request.
pub(crate) async fn https_recording(name: &'static str, pki: &super::pki::Pki, names: &[&str]) -> (Origin, Seen) {
    let seen: Seen = Arc::default();
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config(names));
    let o = serve_inner(TcpListener::bind("127.0.0.1:0").await.unwrap(), name, Some(tls), Some(seen.clone()));
    (o, seen)
}

/// Like [`serve`], recording each request's Authorization header in `seen`.
pub(crate) fn serve_recording(
    listener: TcpListener,
    name: &'static str,
    tls: Option<tokio_rustls::TlsAcceptor>,
    seen: Seen,
) -> Origin {
    serve_inner(listener, name, tls, Some(seen))
}

/// Serves one HTTP/1.1 connection, over TLS when an acceptor is given; a failed handshake or
/// a dropped connection just ends it.
pub(crate) async fn serve_http1<S>(stream: tokio::net::TcpStream, tls: Option<tokio_rustls::TlsAcceptor>, service: S)
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>,
{
    let builder = hyper::server::conn::http1::Builder::new();
    match tls {
        Some(acceptor) => {
            if let Ok(s) = acceptor.accept(stream).await {
                let _ = builder.serve_connection(TokioIo::new(s), service).await;
            }
        }
        None => {
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        }
    }
}

/// Serves on an already bound listener (one made inside a network namespace, say).
pub(crate) fn serve(listener: TcpListener, name: &'static str, tls: Option<tokio_rustls::TlsAcceptor>) -> Origin {
    serve_inner(listener, name, tls, None)
}

fn serve_inner(
    listener: TcpListener,
    name: &'static str,
    tls: Option<tokio_rustls::TlsAcceptor>,
    seen: Option<Seen>,
) -> Origin {
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let tls = tls.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        if let Some(seen) = &seen {
                            let auth = req.headers().get("authorization").and_then(|h| h.to_str().ok()).unwrap_or("-");
                            seen.lock().unwrap().push(auth.to_owned());
                        }
                        let host = req.headers().get("host").and_then(|h| h.to_str().ok()).unwrap_or("-").to_owned();
                        let body = format!("origin {name} {} {} host={host}\n", req.method(), req.uri());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                    }
                });
                serve_http1(stream, tls, service).await;
            });
        }
    });
    Origin { addr, task }
}

/// A raw TCP listener that records whether anything ever connected (for "never dialled").
pub(crate) async fn tripwire() -> (SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hit = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = hit.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            h.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (addr, hit)
}
