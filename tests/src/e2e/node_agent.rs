//! The node agent (`sandgate proxy --node-agent NODE`) against the stand-in API server: it
//! learns its node's sandbox pods by list-and-watch and serves a sandbox only with that
//! sandbox's token from that sandbox's pod address; pods of other nodes, wrong tokens, wrong
//! addresses and deleted pods get 407. Profiles come from the pod.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::kube_api::FakeApi;
use crate::support::{curl, origin, proxy};

const PODS: &str = "/api/v1/namespaces/sandboxes/pods";

fn sha256_hex(token: &str) -> String {
    use std::fmt::Write;
    let d = ring_digest(token.as_bytes());
    d.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// SHA-256 through `sha256sum`, so the test does not share the proxy's hashing code.
fn ring_digest(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    let hex = String::from_utf8(out.stdout).unwrap();
    (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn sandbox_pod(name: &str, node: &str, ip: &str, token: &str, profile: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "sandboxes",
            "labels": {"app.kubernetes.io/managed-by": "sandgate", "sandgate.dev/sandbox-id": name},
            "annotations": {"sandgate.dev/token-sha256": sha256_hex(token), "sandgate.dev/profile": profile}},
        "spec": {"nodeName": node, "containers": [{"name": "workspace", "image": "debian"}]},
        "status": {"phase": "Running", "podIP": ip},
    })
}

/// Waits until `f` holds (the watch is asynchronous).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_agent_serves_only_its_nodes_sandboxes_with_their_tokens() {
    let api = FakeApi::start().await;
    let origin = origin::http("plain").await;
    let port = origin.addr.port();
    api.plant(PODS, sandbox_pod("sbx-a", "node-1", "127.0.0.1", "tok-a", "default"));
    api.plant(PODS, sandbox_pod("sbx-other-node", "node-2", "127.0.0.1", "tok-b", "default"));
    // Another pod on the node, at another address: its token is no use from here.
    api.plant(PODS, sandbox_pod("sbx-c", "node-1", "10.244.1.9", "tok-c", "default"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig_file(dir.path(), "sandboxes");
    let policy = super::loopback_policy(&[port]);
    let p = tokio::task::spawn_blocking(move || {
        proxy::new(&policy).args(&["--node-agent", "node-1", "--kubeconfig", kubeconfig.to_str().unwrap()]).start()
    })
    .await
    .unwrap();
    let via = |user: &str| format!("http://{user}@{}", p.explicit);
    let url = format!("http://origin.test:{port}/agent");
    let get = |user: &str| curl(&["-x", &via(user), &url]);

    // Ready once the pods are listed.
    eventually("ready", || proxy::http_get(p.admin, "/readyz").0 == 200);

    // The sandbox with its token, from its address: served.
    eventually("sbx-a known", || get("sbx-a:tok-a").0 == 200);
    let (_, body, _) = get("sbx-a:tok-a");
    assert!(body.contains("origin plain GET /agent"), "{body}");
    let log = p.wait_log("served", |v| v["sandbox"] == "sbx-a" && v["verdict"] == "allow");
    assert_eq!(log["profile"], "default");

    // Everything else is 407, with the reason in the log.
    for (user, reason) in [
        ("sbx-a:wrong", "proxy_auth_wrong_token"),
        ("sbx-other-node:tok-b", "proxy_auth_unknown_sandbox"),
        ("sbx-c:tok-c", "proxy_auth_wrong_address"),
    ] {
        let (code, body, _) = get(user);
        assert_eq!(code, 407, "{user}: {body}");
        let name = user.split(':').next().unwrap().to_owned();
        p.wait_log(reason, |v| v["sandbox"] == name.as_str() && v["reason"] == reason);
    }
    let (code, _, _) = curl(&["-x", &format!("http://{}", p.explicit), &url]);
    assert_eq!(code, 407, "no credentials");
    // CONNECT is checked the same way.
    let (code, _, _) = curl(&["-p", "-x", &via("sbx-a:wrong"), &url]);
    assert_eq!(code, 407, "CONNECT with a wrong token");

    // A pod that appears later is served once the watch sees it; a deleted one no longer is.
    api.plant(PODS, sandbox_pod("sbx-d", "node-1", "127.0.0.1", "tok-d", "default"));
    eventually("sbx-d served", || get("sbx-d:tok-d").0 == 200);
    api.remove(PODS, "sbx-a");
    eventually("sbx-a forgotten", || get("sbx-a:tok-a").0 == 407);
}

#[test]
fn the_node_agent_is_not_ready_until_it_has_listed_its_pods() {
    // An API server that is not there: the agent starts, serves nobody, and says not ready.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
             current-context: c\n"
        ),
    )
    .unwrap();
    let p = proxy::new(&super::loopback_policy(&[80]))
        .args(&["--node-agent", "node-1", "--kubeconfig", kubeconfig.to_str().unwrap()])
        .start();
    let (code, body) = proxy::http_get(p.admin, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("waiting for the first list"), "{body}");
    let (code, _, _) = curl(&["-x", &format!("http://sbx-a:t@{}", p.explicit), "http://origin.test/"]);
    assert_eq!(code, 407);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_proxy_for_every_node_serves_all_sandbox_pods() {
    let api = FakeApi::start().await;
    let origin = origin::http("plain").await;
    let port = origin.addr.port();
    api.plant(PODS, sandbox_pod("sbx-n1", "node-1", "127.0.0.1", "tok-1", "default"));
    api.plant(PODS, sandbox_pod("sbx-n2", "node-2", "127.0.0.1", "tok-2", "default"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig_file(dir.path(), "sandboxes");
    let policy = super::loopback_policy(&[port]);
    let p = tokio::task::spawn_blocking(move || {
        proxy::new(&policy).args(&["--node-agent", "*", "--kubeconfig", kubeconfig.to_str().unwrap()]).start()
    })
    .await
    .unwrap();
    let url = format!("http://origin.test:{port}/any-node");
    for user in ["sbx-n1:tok-1", "sbx-n2:tok-2"] {
        eventually(user, || curl(&["-x", &format!("http://{user}@{}", p.explicit), &url]).0 == 200);
    }
    let lists: Vec<String> =
        api.requests.lock().unwrap().iter().filter(|r| r.path == "/api/v1/pods").map(|r| r.query.clone()).collect();
    assert!(lists.iter().all(|q| !q.contains("fieldSelector=spec.nodeName")), "{lists:?}");
}

/// The provider and the agent agree: a sandbox `sandgate kube create` makes (token in its proxy
/// URL, the token's hash on the pod) is served by the agent with exactly that URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_made_by_the_provider_is_served_with_its_proxy_url() {
    let api = FakeApi::start().await;
    api.add_cluster_objects(&["namespaces/sandboxes", "runtimeclasses/gvisor", "storageclasses/standard"]);
    let origin = origin::http("plain").await;
    let port = origin.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig_file(dir.path(), "sandboxes");
    let policy = super::loopback_policy(&[port]);
    let k = kubeconfig.clone();
    let p = tokio::task::spawn_blocking(move || {
        proxy::new(&policy).args(&["--node-agent", "node-1", "--kubeconfig", k.to_str().unwrap()]).start()
    })
    .await
    .unwrap();
    let (d, k, agent) = (dir.path().to_owned(), kubeconfig.display().to_string(), p.explicit.to_string());
    let id = tokio::task::spawn_blocking(move || {
        let o = super::kube::kube(&d, &["connect", "--kubeconfig", &k]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = super::kube::kube(&d, &["--proxy", &agent, "create", "--lifetime", "10m"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    })
    .await
    .unwrap();
    let pod = api.objects(PODS).into_iter().find(|p| p["metadata"]["name"] == format!("sbx-{id}").as_str()).unwrap();
    let proxy_url = pod["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "HTTP_PROXY")
        .and_then(|e| e["value"].as_str())
        .unwrap()
        .to_owned();
    let url = format!("http://origin.test:{port}/made");
    eventually("the new sandbox is served", || curl(&["-x", &proxy_url, &url]).0 == 200);
    let log = p.wait_log("served", |v| v["sandbox"] == format!("sbx-{id}").as_str() && v["verdict"] == "allow");
    assert_eq!(log["profile"], "default");
    // The same name with any other token is refused.
    let forged = format!("http://sbx-{id}:forged@{}", p.explicit);
    assert_eq!(curl(&["-x", &forged, &url]).0, 407);
}
