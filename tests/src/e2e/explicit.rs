//! The explicit listener through curl: allowed HTTP and HTTPS, each kind of denial, report
//! mode and domain fronting; each asserts the response, the log event and the metric.

use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::loopback_policy;
use crate::support::{curl, origin, pki::Pki, proxy};

fn allowed(p: &proxy::ProxyProc, reason: &str) -> f64 {
    p.metric("sandgate_proxy_connections_total", &[("verdict", "allow"), ("reason", reason)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_is_forwarded_by_name_with_query_redacted() {
    let o = origin::http("plain").await;
    let p = proxy::new(&loopback_policy(&[o.addr.port()])).start();
    let url = format!("http://origin.test:{}/a/b?token=s3cret", o.addr.port());
    let (code, body, err) = curl(&["-x", &p.url(), &url]);
    assert_eq!(code, 200, "{body}{err}");
    assert_eq!(body.trim(), format!("origin plain GET /a/b?token=s3cret host=origin.test:{}", o.addr.port()));
    let log = p.log_for("origin.test");
    assert_eq!(log["verdict"], "allow");
    assert_eq!(log["reason"], "host_allowed");
    assert_eq!(log["rule"], "test-origins");
    assert_eq!(log["method"], "GET");
    assert_eq!(log["path"], "/a/b?REDACTED");
    assert_eq!(log["dst_addr"], o.addr.to_string());
    assert!(log["bytes_down"].as_u64().unwrap() > 0);
    assert!(!serde_json::to_string(&p.logs()).unwrap().contains("s3cret"), "the query never reaches the log");
    assert_eq!(allowed(&p, "host_allowed"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_through_connect_reaches_the_origin_and_logs_sni() {
    let pki = Pki::new();
    let o = origin::https("tls", &pki, &["origin.test"]).await;
    let p = proxy::new(&loopback_policy(&[o.addr.port()])).start();
    let url = format!("https://origin.test:{}/secure", o.addr.port());
    let (code, body, err) = curl(&["-x", &p.url(), "--cacert", pki.ca_path.to_str().unwrap(), &url]);
    assert_eq!(code, 200, "{body}{err}");
    assert!(body.starts_with("origin tls GET /secure"), "{body}");
    let log = p.log_for("origin.test");
    assert_eq!(log["sni"], "origin.test");
    assert_eq!(log["verdict"], "allow");
    assert!(log["bytes_up"].as_u64().unwrap() > 200, "ClientHello and request counted: {log}");
    assert_eq!(allowed(&p, "host_allowed"), 1.0);
    assert_eq!(p.metric("sandgate_proxy_bytes_total", &[("direction", "down")]), log["bytes_down"].as_f64().unwrap());
}

/// Each denial: the curl status, the body an agent reads, the reason header, the log event
/// and the metric; and the upstream is never dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_are_readable_logged_and_counted() {
    let (trip, hit) = origin::tripwire().await;
    let port = trip.port();
    let p = proxy::new(&loopback_policy(&[port])).start();
    let cases = [
        (
            "unknown host",
            format!("http://evil.example:{port}/"),
            "evil.example",
            "host_not_allowed",
            "no rule allows this host",
        ),
        (
            "deny rule",
            format!("http://admin.origin.test:{port}/"),
            "admin.origin.test",
            "host_denied",
            "a deny rule matches",
        ),
        (
            "port not allowed",
            format!("http://origin.test:{}/", port + 1),
            "origin.test",
            "port_not_allowed",
            "not on this port",
        ),
        (
            "ip literal",
            "http://192.0.2.7/".to_owned(),
            "192.0.2.7",
            "ip_not_allowed",
            "IP destinations need a CIDR rule",
        ),
        ("metadata address", format!("http://meta.test:{port}/"), "meta.test", "address_metadata", "cloud metadata"),
        (
            "resolvable but not allowed",
            format!("http://other.test:{port}/"),
            "other.test",
            "host_not_allowed",
            "no rule allows",
        ),
    ];
    for (case, url, host, reason, text) in cases {
        let (code, body, _) = curl(&["-x", &p.url(), "-D", "-", &url]);
        assert_eq!(code, 403, "{case}: {body}");
        assert!(body.to_lowercase().contains(&format!("x-sandgate-reason: {reason}")), "{case}: {body}");
        assert!(body.contains(&format!("sandgate: denied {host}:")) && body.contains(text), "{case}: {body}");
        assert!(body.contains("profile default"), "{case}: {body}");
        let log = p.wait_log(case, |v| v["dst_host"] == host && v["reason"] == reason);
        assert_eq!(log["verdict"], "deny", "{case}");
        assert!(log.get("dst_addr").is_none(), "{case}: nothing dialled");
        let n = p.metric("sandgate_proxy_connections_total", &[("verdict", "deny"), ("reason", reason)]);
        assert!(n >= 1.0, "{case}: metric {reason}");
    }
    // CONNECT gets the same answer as plain HTTP.
    let (code, _, err) = curl(&["-x", &p.url(), "-p", &format!("http://evil.example:{port}/")]);
    assert_eq!(code, 403, "{err}");
    assert!(!hit.load(Ordering::SeqCst), "a denied destination was dialled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_that_differs_from_the_connect_host_is_refused() {
    let pki = Pki::new();
    let o = origin::https("tls", &pki, &["origin.test", "other.test"]).await;
    let p = proxy::new(&loopback_policy(&[o.addr.port()])).start();

    let mut s = tokio::net::TcpStream::connect(p.explicit).await.unwrap();
    let port = o.addr.port();
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\nHost: origin.test:{port}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    let connector = tokio_rustls::TlsConnector::from(pki.client_config());
    let name = rustls::pki_types::ServerName::try_from("other.test").unwrap();
    let err = connector.connect(name, s).await.expect_err("a fronted handshake must fail");
    assert!(err.to_string().contains("AccessDenied") || err.to_string().contains("access"), "{err}");

    let log = p.wait_log("sni mismatch", |v| v["reason"] == "sni_mismatch");
    assert_eq!(log["verdict"], "deny");
    assert_eq!(log["sni"], "other.test");
    assert_eq!(log["dst_host"], "origin.test");
    assert_eq!(p.metric("sandgate_proxy_connections_total", &[("reason", "sni_mismatch")]), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_mode_lets_a_denied_host_through_and_says_so() {
    let o = origin::http("plain").await;
    let p = proxy::new(&loopback_policy(&[o.addr.port()])).start();
    // `other.test` is not allowed by the `reporting` profile, which the rollout-1 sandbox selects.
    let url = format!("http://other.test:{}/", o.addr.port());
    let (code, body, err) = curl(&["-x", &p.url(), "-U", "rollout-1:ignored", &url]);
    assert_eq!(code, 200, "{body}{err}");
    let log = p.log_for("other.test");
    assert_eq!(log["verdict"], "report");
    assert_eq!(log["reason"], "host_not_allowed");
    assert_eq!(log["profile"], "reporting");
    assert_eq!(log["mode"], "report");
    assert_eq!(log["sandbox"], "rollout-1");
    assert!(
        !body.contains("ignored") && !serde_json::to_string(&log).unwrap().contains("ignored"),
        "no proxy password"
    );
    let n = p.metric(
        "sandgate_proxy_connections_total",
        &[("verdict", "report"), ("profile", "reporting"), ("mode", "report"), ("reason", "host_not_allowed")],
    );
    assert_eq!(n, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_authorization_is_consumed_and_hop_headers_dropped() {
    let o = origin::http("echo").await;
    let p = proxy::new(&loopback_policy(&[o.addr.port()])).start();
    // The origin echoes the request line and Host only, so ask it through a raw request and
    // check what the proxy sends by pointing the proxy at a raw listener instead.
    let raw = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_port = raw.local_addr().unwrap().port();
    let p2 = proxy::new(&loopback_policy(&[raw_port])).start();
    let seen = tokio::spawn(async move {
        let (mut s, _) = raw.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        s.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\nkeep-alive: timeout=5\r\n\r\nok",
        )
        .await
        .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    let url = format!("http://origin.test:{raw_port}/x");
    let (code, body, _) = curl(&[
        "-x",
        &p2.url(),
        "-U",
        "sbx-1:topsecret",
        "-H",
        "Connection: x-drop-me",
        "-H",
        "X-Drop-Me: 1",
        "-H",
        "Keep-Alive: 300",
        "-D",
        "-",
        &url,
    ]);
    assert_eq!(code, 200);
    let req = seen.await.unwrap().to_lowercase();
    assert!(req.starts_with("get /x http/1.1\r\n"), "origin-form upstream: {req}");
    for gone in ["proxy-authorization", "x-drop-me", "keep-alive", "topsecret"] {
        assert!(!req.contains(gone), "{gone} forwarded: {req}");
    }
    assert!(!body.to_lowercase().contains("keep-alive: timeout"), "response hop-by-hop header kept: {body}");
    drop(p);
}
