//! Transparent mode for real (root): a sandbox namespace whose outbound TCP is redirected by
//! nftables in a gateway namespace to the proxy's transparent listener. curl inside the
//! sandbox, with no proxy settings, reaches an allowed name and is refused for others.

use crate::support::netns::{GW_IP, GW_IP6, Topology, privileged};
use crate::support::{origin, pki::Pki, proxy};

/// An address that exists nowhere: the sandbox sends it to its gateway, where the redirect
/// catches it (RFC 2544 benchmarking range, never routed).
const NOWHERE: &str = "198.18.0.10";
/// The same for IPv6 (a unique-local address no namespace holds).
const NOWHERE6: &str = "fd99::10";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirected_connections_are_decided_by_sni_and_host() {
    if !privileged("redirected_connections_are_decided_by_sni_and_host") {
        return;
    }
    let t = Topology::new();
    let pki = Pki::new();
    let https = origin::serve(
        tokio::net::TcpListener::from_std(t.bind_in_gw("127.0.0.1:0")).unwrap(),
        "tls",
        Some(tokio_rustls::TlsAcceptor::from(pki.server_config(&["origin.test", "evil.test"]))),
    );
    let http = origin::serve(tokio::net::TcpListener::from_std(t.bind_in_gw("127.0.0.1:0")).unwrap(), "plain", None);
    let (hp, sp) = (http.addr.port(), https.addr.port());
    let policy = super::loopback_policy(&[hp, sp])
        .replace("other.test: [127.0.0.1]", "other.test: [127.0.0.1]\n  evil.test: [127.0.0.1]");
    // One dual-stack listener takes both families' redirected connections.
    let p = proxy::new(&policy).netns(&t.gw).transparent("[::]:15001").start();
    t.gw_nft(&format!(
        "table inet sandgate_test {{
  chain pre {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"{gw_if}\" ip daddr != {GW_IP} meta l4proto tcp redirect to :15001
    iifname \"{gw_if}\" ip6 daddr != {GW_IP6} meta l4proto tcp redirect to :15001
  }}
}}
",
        gw_if = t.gw_if
    ));
    let ca = pki.ca_path.to_str().unwrap();
    let curl_in_sbx = |args: &[&str]| {
        let mut all = vec!["curl", "-s", "-S", "--max-time", "10", "--noproxy", "*", "-w", "\n%{http_code}"];
        all.extend_from_slice(args);
        let out = t.in_sbx(&all);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let code = stdout.rsplit('\n').next().unwrap_or("").trim().parse::<u16>().unwrap_or(0);
        (code, stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };

    // Allowed names reach their origin although the client dialled an address that exists nowhere.
    let resolve = format!("origin.test:{sp}:{NOWHERE}");
    let (code, body, err) =
        curl_in_sbx(&["--cacert", ca, "--resolve", &resolve, &format!("https://origin.test:{sp}/tls")]);
    assert_eq!(code, 200, "{body}{err}");
    assert!(body.contains("origin tls GET /tls"), "{body}");
    let log = p.wait_log("transparent tls", |v| v["listener"] == "transparent" && v["sni"] == "origin.test");
    assert_eq!(log["verdict"], "allow");
    assert_eq!(log["dst_addr"], format!("127.0.0.1:{sp}"), "dialled as Sandgate resolved it");

    let resolve = format!("origin.test:{hp}:{NOWHERE}");
    let (code, body, err) = curl_in_sbx(&["--resolve", &resolve, &format!("http://origin.test:{hp}/plain")]);
    assert_eq!(code, 200, "{body}{err}");
    assert!(body.contains("origin plain GET /plain"), "{body}");

    // IPv6: the original destination comes from the IPv6 NAT record; the name decides.
    let resolve = format!("origin.test:{sp}:[{NOWHERE6}]");
    let (code, body, err) =
        curl_in_sbx(&["-6", "--cacert", ca, "--resolve", &resolve, &format!("https://origin.test:{sp}/v6")]);
    assert_eq!(code, 200, "{body}{err}");
    assert!(body.contains("origin tls GET /v6"), "{body}");
    let log = p.wait_log("transparent v6", |v| {
        v["listener"] == "transparent" && v["client"].as_str().is_some_and(|c| c.contains("fd00:213::2"))
    });
    assert_eq!(log["sni"], "origin.test");

    // Denied names: HTTP gets a readable 403, TLS a handshake alert.
    let resolve = format!("evil.test:{hp}:{NOWHERE}");
    let (code, body, _) = curl_in_sbx(&["--resolve", &resolve, &format!("http://evil.test:{hp}/")]);
    assert_eq!(code, 403);
    assert!(body.contains("sandgate: denied evil.test:") && body.contains("no rule allows this host"), "{body}");
    let resolve = format!("evil.test:{sp}:{NOWHERE}");
    let (code, _, err) = curl_in_sbx(&["--cacert", ca, "--resolve", &resolve, &format!("https://evil.test:{sp}/")]);
    assert_eq!(code, 0, "TLS to a denied name must fail: {err}");
    assert!(err.contains("alert") || err.contains("SSL"), "{err}");
    p.wait_log("transparent deny", |v| {
        v["listener"] == "transparent" && v["dst_host"] == "evil.test" && v["sni"] == "evil.test"
    });

    // Neither TLS nor HTTP, to an address no CIDR rule allows: closed, decided by address.
    let out = t.in_sbx(&["sh", "-c", &format!("echo hi | timeout 5 bash -c 'cat > /dev/tcp/{NOWHERE}/22'")]);
    let _ = out;
    let log = p.wait_log("by address", |v| v["dst_host"] == NOWHERE);
    assert_eq!(log["reason"], "ip_not_allowed");
    assert_eq!(p.metric("sandgate_proxy_connections_total", &[("listener", "transparent"), ("verdict", "allow")]), 3.0);
}
