//! `sandgate init` for real (root): the sidecar's redirect installed in a namespace that plays
//! the pod, with the proxy running there as its own UID. The workload's TCP reaches the proxy
//! (and is decided by policy), the proxy's own connections are not looped back to it, other
//! packets are refused, and a second run leaves the same rules. Both firewalls.

use std::process::Command;

use crate::support::netns::{GW_IP, Topology, privileged, run};
use crate::support::{origin, proxy};

/// The proxy's UID in the pod (the `sandgate init` default).
const PROXY_UID: u32 = 4750;

#[test]
fn nftables_redirect_sends_the_workload_to_the_proxy() {
    if privileged("nftables_redirect_sends_the_workload_to_the_proxy") {
        redirect_works("nftables", &["nft", "list", "table", "inet", "sandgate-init"]);
    }
}

#[test]
fn iptables_legacy_redirect_sends_the_workload_to_the_proxy() {
    if privileged("iptables_legacy_redirect_sends_the_workload_to_the_proxy") {
        redirect_works("iptables-legacy", &["iptables-legacy-save"]);
    }
}

fn redirect_works(firewall: &str, list: &[&str]) {
    let t = Topology::new();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _enter = rt.enter();
    // The origin lives outside the pod, at the gateway's address.
    let http =
        origin::serve(tokio::net::TcpListener::from_std(t.bind_in_gw(&format!("{GW_IP}:0"))).unwrap(), "plain", None);
    let port = http.addr.port();
    let policy = format!(
        "version: 1\nresolve:\n  origin.test: [{GW_IP}]\nallow:\n  - hosts: [origin.test]\n    ports: [{port}]\n  - cidrs: [{GW_IP}/32]\n    ports: [{port}]\n"
    );
    // Without the redirect, the self-check fails: a probe to nowhere never reaches the port.
    let unverified = crate::support::netns::in_ns(&t.sbx, || sandgate_sidecar::redirect::verify(4751));
    assert!(unverified.is_err(), "verified without any redirect");

    // As in a pod: the init container runs (and proves the redirect) before the proxy starts.
    let init = |t: &Topology| {
        let out = t.in_sbx(&[proxy::sandgate_bin().to_str().unwrap(), "init", "--firewall", firewall]);
        assert!(out.status.success(), "sandgate init: {}", String::from_utf8_lossy(&out.stderr));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("verified=true"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    init(&t);
    let rules = listing(&t, list);
    init(&t);
    assert_eq!(listing(&t, list), rules, "a second `sandgate init` changed the rules");
    let p = proxy::new(&policy).netns(&t.sbx).uid(PROXY_UID).transparent("127.0.0.1:4751").start();

    // The workload (root, no proxy settings) dials the origin's address: the proxy answers.
    let resolve = format!("origin.test:{port}:{GW_IP}");
    let url = format!("http://origin.test:{port}/through");
    let out = t.in_sbx(&["curl", "-s", "-S", "--max-time", "10", "--noproxy", "*", "--resolve", &resolve, &url]);
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("origin plain GET /through"), "{body}{}", String::from_utf8_lossy(&out.stderr));
    let log = p.wait_log("redirected", |v| v["listener"] == "transparent" && v["dst_host"] == "origin.test");
    assert_eq!(log["verdict"], "allow");
    // The proxy's own connection to the origin (its UID is exempt) was not looped back to it.
    assert_eq!(p.logs().iter().filter(|v| v["listener"] == "transparent").count(), 1, "{:?}", p.logs());

    // A name the policy does not allow gets the proxy's refusal, not the origin.
    let resolve = format!("evil.test:{port}:{GW_IP}");
    let url = format!("http://evil.test:{port}/no");
    let out = t.in_sbx(&["curl", "-s", "--max-time", "10", "--noproxy", "*", "--resolve", &resolve, &url]);
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("sandgate") && !body.contains("origin plain"), "{body}");

    // UDP that is not DNS is refused on the way out (the sender sees EPERM).
    let udp = t.in_sbx(&["bash", "-c", &format!("echo leak > /dev/udp/{GW_IP}/9")]);
    assert!(!udp.status.success(), "UDP left the pod");
    // ...but the proxy's UID is not confined.
    let id = PROXY_UID.to_string();
    let udp = t.in_sbx(&[
        "setpriv",
        "--reuid",
        &id,
        "--regid",
        &id,
        "--clear-groups",
        "bash",
        "-c",
        &format!("echo ok > /dev/udp/{GW_IP}/9"),
    ]);
    assert!(udp.status.success(), "{}", String::from_utf8_lossy(&udp.stderr));

    // Nothing new reaches into the pod from outside.
    let listener = crate::support::netns::in_ns(&t.sbx, || std::net::TcpListener::bind("0.0.0.0:8080").unwrap());
    let ns = t.gw.clone();
    let reached = Command::new("ip")
        .args(["netns", "exec", &ns, "curl", "-s", "--max-time", "2", "http://10.213.0.2:8080/"])
        .status()
        .unwrap();
    assert!(!reached.success(), "a connection reached into the pod");
    drop(listener);
}

/// The rules as the firewall lists them, without timestamps or counters.
fn listing(t: &Topology, list: &[&str]) -> String {
    let mut argv = vec!["ip", "netns", "exec", &t.sbx];
    argv.extend_from_slice(list);
    run(&argv)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.starts_with(':') { l.split(" [").next().unwrap_or(l) } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}
