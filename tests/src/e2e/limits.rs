//! Limits: connections per client and in all, oversized ClientHellos; each closes only the
//! offending connection with a logged reason.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::loopback_policy;
use crate::support::{curl, origin, proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_client_limit_get_a_readable_503() {
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let p = proxy::new(&loopback_policy(&[port])).args(&["--max-connections-per-client", "2"]).start();
    // Two idle clients hold the client's quota.
    let _a = TcpStream::connect(p.explicit).await.unwrap();
    let _b = TcpStream::connect(p.explicit).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = TcpStream::connect(p.explicit).await.unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("x-sandgate-reason: limit_client_connections"), "{answer}");
    p.wait_log("limit", |v| v["reason"] == "limit_client_connections");
    assert_eq!(p.metric("sandgate_proxy_connections_total", &[("reason", "limit_client_connections")]), 1.0);
    // Once a place frees up, requests go through again.
    drop((_a, _b));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (code, body, err) = curl(&["-x", &p.url(), &format!("http://origin.test:{port}/")]);
    assert_eq!(code, 200, "{body}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_client_hello_is_refused() {
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let relay = format!("127.0.0.1:0={port}");
    let p = proxy::new(&loopback_policy(&[port])).args(&["--sni-relay", &relay, "--max-hello-bytes", "1024"]).start();
    // A ClientHello that claims 4000 bytes, sent in 512-byte records: past 1 KiB it is refused.
    let mut s = TcpStream::connect(p.sni[0]).await.unwrap();
    let mut msg = vec![1u8, 0, 0x0f, 0xa0];
    msg.resize(2048, 0x42);
    for chunk in msg.chunks(512) {
        let mut rec = vec![22, 3, 1];
        rec.extend_from_slice(&u16::try_from(chunk.len()).unwrap().to_be_bytes());
        rec.extend_from_slice(chunk);
        if s.write_all(&rec).await.is_err() {
            break;
        }
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    let log = p.wait_log("hello too large", |v| v["reason"] == "hello_too_large");
    assert_eq!(log["verdict"], "error");
    assert!(log["error"].as_str().unwrap().contains("1024"), "{log}");
}
