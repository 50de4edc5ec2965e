//! Hot reload: a good policy change takes effect for new connections; a broken file is logged
//! and counted and the running policy stays; SIGHUP reloads; SIGTERM drains and exits 0.

use std::time::Duration;

use super::loopback_policy;
use crate::support::{curl, origin, proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_good_policies_and_keeps_the_old_one_on_errors() {
    let o = origin::http("plain").await;
    let port = o.addr.port();
    let p = proxy::new(&loopback_policy(&[port])).start();
    let other = format!("http://other.test:{port}/");
    assert_eq!(curl(&["-x", &p.url(), &other]).0, 403, "other.test starts denied");

    // A good change, picked up by the file watcher.
    let widened = loopback_policy(&[port])
        .replace("hosts: [origin.test, git.test, meta.test]", "hosts: [origin.test, git.test, meta.test, other.test]");
    std::fs::write(&p.policy_path, widened).unwrap();
    wait_for(|| p.metric("sandgate_proxy_policy_reloads_total", &[("result", "ok")]) >= 1.0);
    assert_eq!(curl(&["-x", &p.url(), &other]).0, 200, "the new rule applies to new connections");

    // A broken file: logged, counted, and the running policy (which allows other.test) stays.
    std::fs::write(&p.policy_path, "version: 1\nallow:\n  - hosts: [\"*github.com\"]\n").unwrap();
    wait_for(|| p.metric("sandgate_proxy_policy_reloads_total", &[("result", "error")]) >= 1.0);
    assert_eq!(curl(&["-x", &p.url(), &other]).0, 200, "the old policy stays in force");
    let diag = p.diag().join("\n");
    assert!(
        diag.contains("policy reload failed, keeping the running policy") && diag.contains("*github.com"),
        "{diag}"
    );

    // SIGHUP reloads at once (the file is unchanged and still broken: another error).
    let before = p.metric("sandgate_proxy_policy_reloads_total", &[("result", "error")]);
    p.signal("HUP");
    wait_for(|| p.metric("sandgate_proxy_policy_reloads_total", &[("result", "error")]) > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_cleanly_and_admin_reports_health() {
    let o = origin::http("plain").await;
    let mut p = proxy::new(&loopback_policy(&[o.addr.port()])).start();
    assert_eq!(proxy::http_get(p.admin, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(proxy::http_get(p.admin, "/readyz").0, 200);
    let metrics = p.metrics();
    assert!(metrics.contains("sandgate_build_info{version=\""), "{metrics}");
    assert!(metrics.contains("# HELP sandgate_proxy_active_connections"), "{metrics}");
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(p.diag().iter().any(|l| l.contains("SIGTERM: draining")));
}

fn wait_for(cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "condition not met in time");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_live_tunnels_finish_and_stops_new_ones() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let mut p = proxy::new(&loopback_policy(&[port])).start();
    let mut s = tokio::net::TcpStream::connect(p.explicit).await.unwrap();
    s.write_all(format!("CONNECT origin.test:{port} HTTP/1.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(s.read_u8().await.unwrap());
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    p.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    // The live tunnel still carries bytes while the proxy drains...
    s.write_all(b"still here").await.unwrap();
    let mut back = [0u8; 10];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still here");
    // ...new connections are no longer accepted...
    assert!(std::net::TcpStream::connect(p.explicit).is_err(), "accepting while draining");
    // ...and once it closes, the proxy exits cleanly.
    drop(s);
    assert_eq!(p.wait_exit(Duration::from_secs(5)), Some(0));
    let log = p.wait_log("drained tunnel", |v| v["dst_host"] == "origin.test");
    assert_eq!(log["bytes_up"], 10);
}
