//! `sandgate kube` against a stand-in API server (no cluster can run here): connect and Test
//! connection, create in order, pause and resume on the same claim, destroy through the anchor,
//! and the reaper finding what a dead control process left. Every body the provider sent is
//! validated against the Kubernetes schemas (strict).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::support::kube_api::FakeApi;
use crate::support::{k8s, proxy::sandgate_bin};

const NS: &str = "sandboxes";
const PODS: &str = "/api/v1/namespaces/sandboxes/pods";
const CONFIGMAPS: &str = "/api/v1/namespaces/sandboxes/configmaps";
const CLAIMS: &str = "/api/v1/namespaces/sandboxes/persistentvolumeclaims";
const POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/sandboxes/networkpolicies";

/// Runs `sandgate kube ARGS` with a vault in `dir` (the command's own runtime is separate).
pub(super) fn kube(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(sandgate_bin())
        .arg("kube")
        .args(["--namespace", NS])
        .args(if args.contains(&"--proxy") { &[][..] } else { &["--proxy", "10.96.0.40:4750"][..] })
        .args(if args.contains(&"--storage-class") { &[][..] } else { &["--storage-class", "standard"][..] })
        .arg("--vault")
        .arg(dir.join("vault.json"))
        .arg("--key-file")
        .arg(dir.join("vault.key"))
        .args(args)
        .env_remove("SANDGATE_VAULT_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("unrecognized subcommand 'kube'"),
        "this sandgate was built without Kubernetes: cargo build --bin sandgate --features sandgate-control/kubernetes"
    );
    out
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_speaks_the_kubernetes_api() {
    let api = FakeApi::start().await;
    api.add_cluster_objects(&["namespaces/sandboxes", "runtimeclasses/gvisor", "storageclasses/standard"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();

    // A kubeconfig that runs a program for credentials is refused.
    let exec = d.join("exec.yaml");
    std::fs::write(
        &exec,
        api.kubeconfig(NS).replace(
            "    token: fake-sa-token",
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws",
        ),
    )
    .unwrap();
    let o = tokio::task::spawn_blocking({
        let (d, exec) = (d.clone(), exec.clone());
        move || kube(&d, &["connect", "--kubeconfig", exec.to_str().unwrap()])
    })
    .await
    .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("(`exec`)"), "{}", text(&o));
    assert!(!d.join("vault.key").exists(), "a refused kubeconfig left a vault key behind");

    // Test connection with two failures: each is named, and nothing is saved.
    api.cluster.lock().unwrap().denied.push(("delete".into(), "pods".into()));
    let good = d.join("kubeconfig.yaml");
    std::fs::write(&good, api.kubeconfig(NS)).unwrap();
    let run = |args: Vec<String>| {
        let d = d.clone();
        tokio::task::spawn_blocking(move || kube(&d, &args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    let o = run(vec![
        "--storage-class".into(),
        "fast".into(),
        "connect".into(),
        "--kubeconfig".into(),
        good.display().to_string(),
    ])
    .await
    .unwrap();
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("ok    API server version v1.33.4"), "{t}");
    assert!(t.contains("FAIL  may delete pods: no RBAC rule allows it"), "{t}");
    assert!(t.contains("FAIL  storage class fast: not found"), "{t}");
    assert!(t.contains("ok    runtime class gvisor"), "{t}");
    assert!(t.contains("not saved"), "{t}");
    api.cluster.lock().unwrap().denied.clear();
    let o = run(vec!["connect".into(), "--kubeconfig".into(), good.display().to_string()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // The kubeconfig is sealed: its token is nowhere in the vault file.
    assert!(!std::fs::read_to_string(d.join("vault.json")).unwrap().contains("fake-sa-token"));
    let o = run(vec!["test".into()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let reviews = api.calls().iter().filter(|c| c.ends_with("selfsubjectaccessreviews")).count();
    assert!(reviews >= 14, "one SelfSubjectAccessReview per verb: {reviews}");

    // Create: anchor, policy, claim, pod, in that order; all owned by the anchor.
    api.clear();
    let o = run(vec!["create".into(), "--lifetime".into(), "1h".into(), "--cpus".into(), "1.5".into()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let posts: Vec<String> = api.calls().into_iter().filter(|c| c.starts_with("POST")).collect();
    assert_eq!(
        posts,
        [format!("POST {CONFIGMAPS}"), format!("POST {POLICIES}"), format!("POST {CLAIMS}"), format!("POST {PODS}")]
    );
    let anchor_uid = api.objects(CONFIGMAPS)[0]["metadata"]["uid"].clone();
    for collection in [POLICIES, CLAIMS, PODS] {
        assert_eq!(api.objects(collection)[0]["metadata"]["ownerReferences"][0]["uid"], anchor_uid, "{collection}");
    }
    let pod = &api.objects(PODS)[0];
    let spec = &pod["spec"];
    assert_eq!(spec["runtimeClassName"], "gvisor");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let deadline = spec["activeDeadlineSeconds"].as_u64().unwrap();
    assert!((3590..=3600).contains(&deadline), "{deadline}");
    assert_eq!(spec["containers"][0]["resources"]["limits"], json!({"cpu": "1500m", "memory": "2048Mi"}));
    assert_eq!(spec["containers"][0]["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(spec["volumes"][0]["persistentVolumeClaim"]["claimName"], format!("ws-{id}"));
    let env = spec["containers"][0]["env"].to_string();
    assert!(env.contains(&format!("http://sbx-{id}:")) && env.contains("@10.96.0.40:4750"), "{env}");
    for key in ["sandgate.dev/created-at", "sandgate.dev/expires-at"] {
        assert!(pod["metadata"]["annotations"][key].is_string(), "{key}");
    }
    assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/managed-by"], "sandgate");
    let policy = &api.objects(POLICIES)[0]["spec"];
    assert_eq!(policy["ingress"], json!([]));
    assert_eq!(policy["egress"][0]["ports"], json!([{"protocol": "TCP", "port": 4750}]));

    // Pause deletes the pod and keeps the claim; resume makes a new pod on it with less time.
    let o = run(vec!["pause".into(), id.clone()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(api.objects(PODS).is_empty());
    assert_eq!(api.objects(CLAIMS).len(), 1);
    let o = run(vec!["ls".into()]).await.unwrap();
    assert!(text(&o).contains(&format!("{id}   paused")), "{}", text(&o));
    let o = run(vec!["pause".into(), id.clone()]).await.unwrap();
    assert!(!o.status.success() && text(&o).contains("already paused"), "{}", text(&o));
    let o = run(vec!["resume".into(), id.clone()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let pod = &api.objects(PODS)[0];
    assert_eq!(pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], format!("ws-{id}"));
    assert!(pod["spec"]["activeDeadlineSeconds"].as_u64().unwrap() <= deadline);
    let o = run(vec!["ls".into()]).await.unwrap();
    assert!(text(&o).contains(&format!("{id}   running")), "{}", text(&o));

    // Destroy deletes the anchor only; what it owns goes with it.
    api.clear();
    let o = run(vec!["rm".into(), id.clone()]).await.unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        api.calls().iter().filter(|c| c.starts_with("DELETE")).collect::<Vec<_>>(),
        [&format!("DELETE {CONFIGMAPS}/sbx-{id}")]
    );
    for c in [CONFIGMAPS, POLICIES, CLAIMS, PODS] {
        assert!(api.objects(c).is_empty(), "{c} left");
    }

    // What a control process that died left: an expired paused sandbox, a live one, an orphan pod.
    let meta = |name: &str, id: &str, expires: &str| {
        json!({"name": name, "namespace": NS,
        "labels": {"app.kubernetes.io/managed-by": "sandgate", "sandgate.dev/sandbox-id": id},
        "annotations": {"sandgate.dev/created-at": "2026-11-29T00:00:00Z", "sandgate.dev/expires-at": expires}})
    };
    let old = api.plant(
        CONFIGMAPS,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("sbx-old", "old", "2026-01-01T00:00:00Z")}),
    );
    let mut claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("ws-old", "old", "2026-01-01T00:00:00Z")});
    claim["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "sbx-old", "uid": old["metadata"]["uid"]}]);
    api.plant(CLAIMS, claim);
    api.plant(
        CONFIGMAPS,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("sbx-live", "live", "2999-01-01T00:00:00Z")}),
    );
    api.plant(
        PODS,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("sbx-stray", "stray", "2999-01-01T00:00:00Z")}),
    );
    let o = run(vec!["reap".into()]).await.unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("removed configmap/sbx-old (expired)"), "{t}");
    assert!(t.contains("removed pod/sbx-stray (orphaned)"), "{t}");
    assert!(!t.contains("sbx-live"), "{t}");
    assert!(api.objects(CLAIMS).is_empty(), "the expired sandbox's claim went with its anchor");
    // The reaper found them by label, not by anything this process remembered.
    let lists: Vec<String> = api
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.method == "GET" && r.path == PODS)
        .map(|r| r.query.clone())
        .collect();
    assert!(lists.iter().all(|q| q.contains("labelSelector=app.kubernetes.io")), "{lists:?}");
    assert_eq!(api.objects(CONFIGMAPS).len(), 1);

    // Every object the provider sent is valid (DELETE bodies are DeleteOptions, not objects).
    let bodies: Vec<Value> =
        api.requests.lock().unwrap().iter().filter(|r| r.method == "POST").filter_map(|r| r.body.clone()).collect();
    let all: Vec<String> = bodies.iter().map(Value::to_string).collect();
    assert!(all.len() >= 20, "{}", all.len());
    k8s::validate("the provider's request bodies", &all.join("\n---\n"));
}

/// The reaper's CronJob path (`--in-cluster`): the pod's service account files and the
/// `KUBERNETES_SERVICE_*` variables, made for real in a private mount namespace (root) over a
/// tmpfs on /run, so the machine's own /run is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_cluster_reaper_uses_the_pods_service_account() {
    if !crate::support::netns::privileged("the_in_cluster_reaper_uses_the_pods_service_account") {
        return;
    }
    let api = FakeApi::start().await;
    let meta = json!({"name": "sbx-gone", "namespace": NS,
        "labels": {"app.kubernetes.io/managed-by": "sandgate", "sandgate.dev/sandbox-id": "gone"},
        "annotations": {"sandgate.dev/created-at": "2026-01-01T00:00:00Z", "sandgate.dev/expires-at": "2026-01-01T06:00:00Z"}});
    api.plant(CONFIGMAPS, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}));
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&api.pki.ca_path, dir.path().join("ca.crt")).unwrap();
    std::fs::write(dir.path().join("token"), crate::support::kube_api::TOKEN).unwrap();
    std::fs::write(dir.path().join("namespace"), "sandgate-system").unwrap();
    let sa = "/run/secrets/kubernetes.io/serviceaccount";
    let script = format!(
        "mount -t tmpfs none /run && mkdir -p {sa} && cp {src}/* {sa}/ && exec {bin} kube --in-cluster --namespace {NS} reap",
        src = dir.path().display(),
        bin = sandgate_bin().display()
    );
    let port = api.addr.port();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", port.to_string())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("removed configmap/sbx-gone (expired)"), "{t}");
    assert!(api.objects(CONFIGMAPS).is_empty());
}

/// `kube test --deep`: a probe sandbox made like a real one; its exit code (set here as the
/// kubelet would report it) says whether the CNI enforced its NetworkPolicy. The probe is
/// removed either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deep_check_finds_a_cni_that_ignores_network_policy() {
    let api = std::sync::Arc::new(FakeApi::start().await);
    api.add_cluster_objects(&["namespaces/sandboxes", "runtimeclasses/gvisor", "storageclasses/standard"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let kc = d.join("kubeconfig.yaml");
    std::fs::write(&kc, api.kubeconfig(NS)).unwrap();
    let o = kube(&d, &["connect", "--kubeconfig", kc.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for (exit_code, expect) in [
        (
            10,
            "FAIL  a probe sandbox: direct egress blocked, the proxy reachable: the probe reached an outside address directly",
        ),
        (
            11,
            "FAIL  a probe sandbox: direct egress blocked, the proxy reachable: the probe could not reach the proxy at 10.96.0.40:4750",
        ),
        (0, "ok    a probe sandbox: direct egress blocked, the proxy reachable"),
    ] {
        let d2 = d.clone();
        let run = tokio::task::spawn_blocking(move || kube(&d2, &["test", "--deep"]));
        // The kubelet's report: the probe container ran and exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(std::time::Instant::now() < deadline, "no probe pod");
            let reported = {
                let mut c = api.cluster.lock().unwrap();
                let pod = c.objects.get_mut(PODS).and_then(|l| l.first_mut());
                pod.map(|pod| {
                    let script = pod["spec"]["containers"][0]["command"].to_string();
                    assert!(script.contains("--noproxy") && script.contains("exit 10"), "{script}");
                    pod["status"] = json!({"phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
                        "containerStatuses": [{"name": "workspace", "image": "curlimages/curl:8.11.1", "imageID": "",
                            "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": exit_code}}}]});
                })
            };
            if reported.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let o = run.await.unwrap();
        let t = text(&o);
        assert!(t.contains(expect), "{exit_code}: {t}");
        assert_eq!(o.status.success(), exit_code == 0, "{t}");
        for c in [CONFIGMAPS, POLICIES, PODS] {
            assert!(api.objects(c).is_empty(), "{c}: the probe was left behind");
        }
    }
    let bodies: Vec<String> = api
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.method == "POST")
        .filter_map(|r| r.body.as_ref().map(Value::to_string))
        .collect();
    k8s::validate("the probe's objects", &bodies.join("\n---\n"));
}
