//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process answers) and
//! `/readyz` (listeners bound, not draining, and in node-agent mode the sandbox pods listed).
//! Loopback by default; it exposes no secrets, but host names and decisions are the operator's
//! business.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::shared::Shared;

/// Serves admin requests until `stop` turns true.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("admin accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(respond(&shared, &req)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(10));
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn respond(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let mut r = Response::new(Full::new(Bytes::from(shared.metrics.encode())));
            r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; version=0.0.4"));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if shared.draining.load(Ordering::Acquire) => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        "/readyz" if shared.identities.as_ref().is_some_and(|i| !i.is_synced()) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "waiting for the first list of sandbox pods\n")
        }
        "/readyz" => text(StatusCode::OK, "ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found; try /metrics, /healthz or /readyz\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}
