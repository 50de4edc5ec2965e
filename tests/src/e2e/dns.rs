//! Names resolved by Sandgate itself through a configured DNS server (`--dns-server`): a tiny
//! authoritative server on `127.0.0.1:0` answers `dns.test` with 127.0.0.1 and everything
//! else with NXDOMAIN.

use std::net::UdpSocket;

use super::loopback_policy;
use crate::support::{curl, origin, proxy};

/// Answers A queries for `dns.test` (127.0.0.1, TTL 60) and NXDOMAIN for other names, until
/// the socket is dropped with the test.
fn dns_server() -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let queries = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let q = queries.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            q.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let query = &buf[..n];
            if n < 12 {
                continue;
            }
            // The question: labels from offset 12 to the root, then type and class.
            let mut i = 12;
            let mut labels = Vec::new();
            while i < n && query[i] != 0 {
                let len = usize::from(query[i]);
                labels.push(String::from_utf8_lossy(&query[i + 1..(i + 1 + len).min(n)]).to_lowercase());
                i += 1 + len;
            }
            let qend = (i + 5).min(n);
            let qtype = u16::from_be_bytes([query[i + 1], query[i + 2]]);
            let name = labels.join(".");
            let mut resp = Vec::with_capacity(64);
            resp.extend_from_slice(&query[..2]); // id
            let found = name == "dns.test";
            let rcode = if found { 0 } else { 3 };
            resp.extend_from_slice(&[0x85, 0x80 | rcode]); // response, authoritative, RD, RA
            let answers: u16 = u16::from(found && qtype == 1);
            // No answer (NXDOMAIN, or no AAAA): an SOA in the authority section, as real
            // servers send, so the resolver may cache the negative answer for its minimum TTL.
            let authority = 1 - answers;
            resp.extend_from_slice(&[0, 1, 0, answers as u8, 0, authority as u8, 0, 0]);
            resp.extend_from_slice(&query[12..qend]);
            if answers == 1 {
                resp.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]);
            } else {
                resp.extend_from_slice(&[0xc0, 12, 0, 6, 0, 1, 0, 0, 0, 60, 0, 22, 0, 0]);
                resp.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 60, 0, 0, 0, 60, 0, 0, 0, 60, 0, 0, 0, 60]);
            }
            let _ = sock.send_to(&resp, from);
        }
    });
    (addr, queries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_resolved_through_the_configured_server_and_cached() {
    let (dns, queries) = dns_server();
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let policy = loopback_policy(&[port]).replace(
        "hosts: [origin.test, git.test, meta.test]",
        "hosts: [origin.test, git.test, meta.test, dns.test, nx.test]",
    );
    let p = proxy::new(&policy).args(&["--dns-server", &dns.to_string()]).start();
    for _ in 0..3 {
        let (code, body, err) = curl(&["-x", &p.url(), &format!("http://dns.test:{port}/resolved")]);
        assert_eq!(code, 200, "{body}{err}");
        assert!(body.contains("origin plain GET /resolved host=dns.test"), "{body}");
    }
    let log = p.log_for("dns.test");
    assert_eq!(log["dst_addr"], format!("127.0.0.1:{port}"));
    assert!(p.metric("sandgate_proxy_dns_seconds_count", &[("source", "dns")]) >= 3.0);
    // Three requests, but the answer's TTL keeps it cached: at most one A and one AAAA query.
    assert!(queries.load(std::sync::atomic::Ordering::SeqCst) <= 2, "cache not used: {queries:?}");

    let (code, body, _) = curl(&["-x", &p.url(), "-D", "-", &format!("http://nx.test:{port}/")]);
    assert_eq!(code, 502, "{body}");
    assert!(body.contains("x-sandgate-reason: resolve_failed"), "{body}");
    let log = p.log_for("nx.test");
    assert_eq!(log["reason"], "resolve_failed");
    assert!(log.get("dst_addr").is_none());
}

/// A query for `name` of type `qtype` (1 = A, 16 = TXT).
fn query(id: u16, name: &str, qtype: u8) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, qtype, 0, 1]);
    q
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dns_responder_answers_allowed_names_only() {
    let p = proxy::new(&loopback_policy(&[443])).args(&["--dns", "127.0.0.1:0"]).start();
    let dns = p.dns.expect("the DNS listener is announced");
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
    let ask = |id: u16, name: &str, qtype: u8| {
        s.send_to(&query(id, name, qtype), dns).unwrap();
        let mut buf = [0u8; 512];
        let n = s.recv(&mut buf).unwrap();
        buf[..n].to_vec()
    };
    let a = ask(7, "Origin.Test", 1);
    assert_eq!(&a[..2], &[0, 7], "the reply carries the query's id");
    assert_eq!(a[3] & 0x0f, 0);
    assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1, "one answer");
    assert!(a.ends_with(&[127, 0, 0, 1]), "{a:?}");
    let txt = ask(8, "origin.test", 16);
    assert_eq!(
        (txt[3] & 0x0f, u16::from_be_bytes([txt[6], txt[7]])),
        (0, 0),
        "other types of an allowed name: no data"
    );
    let denied = ask(9, "exfil.attacker.example", 1);
    assert_eq!(denied[3] & 0x0f, 3, "NXDOMAIN");
    let log = p.wait_log("dns deny", |v| v["listener"] == "dns" && v["dst_host"] == "exfil.attacker.example");
    assert_eq!((log["verdict"].as_str(), log["reason"].as_str()), (Some("deny"), Some("host_not_allowed")));
    // Garbage gets no answer and does not stop the responder.
    s.send_to(b"\x00\x01garbage", dns).unwrap();
    assert_eq!(ask(10, "origin.test", 1)[3] & 0x0f, 0);
}
