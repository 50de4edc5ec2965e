//! ClientHello checks inside CONNECT tunnels that need a hand-made hello: Encrypted Client
//! Hello refused by policy, and judged by its outer name otherwise.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::loopback_policy;
use crate::support::proxy;

/// A ClientHello for `name` carrying an encrypted_client_hello extension.
fn ech_hello(name: &str) -> Vec<u8> {
    let mut sni = Vec::new();
    sni.extend_from_slice(&u16::try_from(name.len() + 3).unwrap().to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    sni.extend_from_slice(name.as_bytes());
    let mut exts = Vec::new();
    exts.extend_from_slice(&[0, 0]);
    exts.extend_from_slice(&u16::try_from(sni.len()).unwrap().to_be_bytes());
    exts.extend_from_slice(&sni);
    exts.extend_from_slice(&[0xfe, 0x0d, 0, 8, 0, 0, 1, 0, 1, 7, 0, 0]);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[9; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&u16::try_from(exts.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&exts);
    let n = body.len();
    let mut msg = vec![1, 0, (n >> 8) as u8, n as u8];
    msg.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&u16::try_from(msg.len()).unwrap().to_be_bytes());
    rec.extend_from_slice(&msg);
    rec
}

/// Sends CONNECT then `hello` and returns what came back after the 200.
async fn connect_then(proxy: std::net::SocketAddr, host: &str, port: u16, hello: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    s.write_all(hello).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ech_is_refused_when_the_policy_says_so_and_judged_by_outer_sni_otherwise() {
    let sink = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = sink.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = sink.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    let refusing = loopback_policy(&[port]).replacen("version: 1\n", "version: 1\nrefuse_ech: true\n", 1);
    let p = proxy::new(&refusing).start();
    let answer = connect_then(p.explicit, "origin.test", port, &ech_hello("origin.test")).await;
    assert_eq!(answer, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31], "a fatal access_denied alert");
    let log = p.wait_log("ech", |v| v["reason"] == "ech_refused");
    assert_eq!(log["verdict"], "deny");
    assert_eq!(log["sni"], "origin.test");

    // Without refuse_ech the outer name decides: matching passes, another name is fronting.
    let p = proxy::new(&loopback_policy(&[port])).start();
    let _ = connect_then(p.explicit, "origin.test", port, &ech_hello("origin.test")).await;
    let log = p.wait_log("ech allowed", |v| v["dst_host"] == "origin.test" && v["verdict"] == "allow");
    assert_eq!(log["sni"], "origin.test");
    let answer = connect_then(p.explicit, "origin.test", port, &ech_hello("public.example")).await;
    assert_eq!(answer, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31]);
    p.wait_log("outer sni mismatch", |v| v["reason"] == "sni_mismatch" && v["sni"] == "public.example");
}
