//! Malformed and hostile clients: each closes only its own connection, is logged with a
//! reason, and a normal request through the same proxy succeeds afterwards.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::loopback_policy;
use crate::support::{curl, origin, pki::Pki, proxy};

async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn still_serves(p: &proxy::ProxyProc, port: u16) {
    let (code, body, err) = curl(&["-x", &p.url(), &format!("http://origin.test:{port}/after")]);
    assert_eq!(code, 200, "proxy stopped serving: {body}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_errors_and_the_proxy_keeps_serving() {
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let p = proxy::new(&loopback_policy(&[port])).args(&["--max-header-bytes", "8192"]).start();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("CONNECT without port", b"CONNECT origin.test HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(), "400"),
        ("garbage request line", b"\x01\x02 nonsense\r\n\r\n".to_vec(), "400"),
        ("origin-form request, no absolute URI", b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(), "400"),
        ("no host at all", b"GET / HTTP/1.1\r\n\r\n".to_vec(), "400"),
        ("https in absolute form", b"GET https://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n\r\n".to_vec(), "400"),
        (
            "oversized headers",
            format!("GET http://origin.test:{port}/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024)).into_bytes(),
            "431",
        ),
    ];
    for (case, bytes, status) in cases {
        let answer = exchange(p.explicit, &bytes).await;
        assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{case}: {answer:?}");
        still_serves(&p, port);
    }
    let errors = p.metric("sandgate_proxy_connections_total", &[("verdict", "error")]);
    assert!(errors >= 4.0, "malformed requests counted: {errors}");
    p.wait_log("malformed", |v| v["reason"] == "malformed_request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_cut_off_at_the_header_timeout() {
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let p = proxy::new(&loopback_policy(&[port])).args(&["--header-timeout", "500ms"]).start();
    let mut s = TcpStream::connect(p.explicit).await.unwrap();
    s.write_all(b"GET http://origin.test/ HTTP/1.1\r\nX-Slow: ").await.unwrap();
    let started = std::time::Instant::now();
    let mut out = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), async {
        for _ in 0..50 {
            if s.write_all(b"a").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = s.read_to_end(&mut out).await;
    })
    .await;
    assert!(r.is_ok(), "a trickling client was never cut off");
    assert!(started.elapsed() < Duration::from_secs(4), "cut off late: {:?}", started.elapsed());
    p.wait_log("header timeout", |v| v["reason"] == "header_timeout");
    still_serves(&p, port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_relay_survives_garbage_and_truncated_or_trickled_hellos() {
    let pki = Pki::new();
    let o = origin::https("tls", &pki, &["origin.test"]).await;
    let port = o.addr.port();
    let relay = format!("127.0.0.1:0={port}");
    let p = proxy::new(&loopback_policy(&[port])).args(&["--sni-relay", &relay, "--hello-timeout", "1s"]).start();
    let sni = p.sni[0];

    // Random bytes: closed, logged, nothing dialled.
    let answer = exchange(sni, &[0x16, 0x03, 0x01, 0x00, 0x05, 0xde, 0xad, 0xbe, 0xef, 0x00]).await;
    assert!(answer.is_empty() || answer.as_bytes()[0] == 0x15, "{answer:?}");
    p.wait_log("malformed hello", |v| v["reason"] == "malformed_hello");
    let answer = exchange(sni, b"\x00\x01\x02\x03 random junk that is neither TLS nor HTTP").await;
    assert!(answer.is_empty(), "{answer:?}");

    // A real ClientHello, captured from rustls, cut short then closed: logged as malformed.
    let hello = capture_client_hello(&pki).await;
    let _ = exchange(sni, &hello[..hello.len() / 2]).await;
    // A truncated hello that stays open: cut off at the hello timeout.
    let mut held = TcpStream::connect(sni).await.unwrap();
    held.write_all(&hello[..20]).await.unwrap();
    p.wait_log("hello timeout", |v| v["reason"] == "hello_timeout");

    // The same ClientHello written one byte at a time still gets through: a real handshake
    // over a stream that trickles its first flight.
    let stream = TcpStream::connect(sni).await.unwrap();
    let trickle = Trickle { inner: stream, first_flight_left: hello.len() };
    let connector = tokio_rustls::TlsConnector::from(pki.client_config());
    let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
    let mut tls = connector.connect(name, trickle).await.expect("handshake through the relay");
    tls.write_all(b"GET /trickled HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut body = Vec::new();
    let _ = tls.read_to_end(&mut body).await;
    assert!(String::from_utf8_lossy(&body).contains("origin tls GET /trickled"), "{}", String::from_utf8_lossy(&body));
    drop(tls); // the record is written when both directions have ended
    let log = p.wait_log("trickled", |v| v["listener"] == "sni" && v["verdict"] == "allow");
    assert_eq!(log["sni"], "origin.test");

    // A denied SNI is closed with a TLS alert.
    let name = rustls::pki_types::ServerName::try_from("evil.example").unwrap();
    let stream = TcpStream::connect(sni).await.unwrap();
    assert!(connector.connect(name, stream).await.is_err());
    p.wait_log("denied sni", |v| v["dst_host"] == "evil.example" && v["verdict"] == "deny");
    let url = format!("https://origin.test:{port}/after");
    let (code, body, err) = curl(&["-x", &p.url(), "--cacert", pki.ca_path.to_str().unwrap(), &url]);
    assert_eq!(code, 200, "proxy stopped serving: {body}{err}");
}

/// The bytes of a rustls ClientHello for `origin.test` (as sent on the wire).
async fn capture_client_hello(pki: &Pki) -> Vec<u8> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let config = pki.client_config();
    tokio::spawn(async move {
        let s = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("origin.test").unwrap();
        let _ = tokio_rustls::TlsConnector::from(config).connect(name, s).await;
    });
    let (mut s, _) = l.accept().await.unwrap();
    let mut buf = vec![0u8; 16384];
    let mut n = 0;
    while n < 5 || n < 5 + usize::from(u16::from_be_bytes([buf[3], buf[4]])) {
        n += s.read(&mut buf[n..]).await.unwrap();
    }
    buf.truncate(n);
    buf
}

/// A stream that sends its first `first_flight_left` bytes one write per byte.
struct Trickle {
    inner: TcpStream,
    first_flight_left: usize,
}

impl tokio::io::AsyncRead for Trickle {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Trickle {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.first_flight_left > 0 && !buf.is_empty() {
            let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, &buf[..1]);
            if let std::task::Poll::Ready(Ok(n)) = &r {
                self.first_flight_left -= n;
                // Give each byte its own segment.
                let _ = self.inner.set_nodelay(true);
                std::thread::sleep(Duration::from_millis(1));
            }
            return r;
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
