//! `sandgate webhook` over real HTTPS: a real AdmissionReview document POSTed with curl, the
//! returned JSON patch applied with a JSON-patch library, and the resulting pod validated
//! against the Kubernetes schemas (strict). A refused pod and a renewed certificate too.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::support::pki::Pki;
use crate::support::{k8s, proxy::sandgate_bin};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../sidecar/tests/fixtures/admission/pod-create.json");

struct Webhook {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(cert: &Path, key: &Path) -> Webhook {
    let mut child = Command::new(sandgate_bin())
        .args([
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--image",
            "ghcr.io/sandgate/sandgate:test",
        ])
        .args(["--vault-secret", "sandgate-vault", "--tls-cert"])
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut addr, mut admin) = (None, None);
    while addr.is_none() || admin.is_none() {
        assert!(Instant::now() < deadline, "webhook did not start");
        let line = lines.next().expect("webhook exited").unwrap();
        let Some(a) = line.split("addr=").nth(1).and_then(|a| a.trim().parse::<SocketAddr>().ok()) else { continue };
        if line.contains("listener=\"admin\"") {
            admin = Some(a);
        } else {
            addr = Some(a);
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    Webhook { child, addr: addr.unwrap(), admin: admin.unwrap() }
}

/// POSTs `review` to `path` and returns the AdmissionReview response document.
fn post(w: &Webhook, ca: &Path, path: &str, review: &Value) -> Value {
    let resolve = format!("webhook.test:{}:127.0.0.1", w.addr.port());
    let out = Command::new("curl")
        .args(["-s", "-S", "--fail", "--noproxy", "*", "--resolve", &resolve, "--cacert"])
        .arg(ca)
        .args(["-H", "content-type: application/json", "--data-binary", &review.to_string()])
        .arg(format!("https://webhook.test:{}{path}", w.addr.port()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_injected_pod_is_valid_and_a_bypassing_pod_is_refused() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pki.leaf_files(&["webhook.test"], dir.path());
    let w = start(&cert, &key);
    let review: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();

    let answer = post(&w, &pki.ca_path, "/inject/namespace", &review);
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], review["request"]["uid"]);
    assert_eq!(response["allowed"], true);
    let patch = base64::engine::general_purpose::STANDARD.decode(response["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    // The API server fills in the name from generateName before validation.
    pod["metadata"]["name"] = json!("agent-7c9d8f-x2x9z");
    k8s::validate("the injected pod", &pod.to_string());
    let inits: Vec<&str> =
        pod["spec"]["initContainers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(inits, ["sandgate-init", "sandgate-proxy", "fetch-tools"]);

    // Sent again (reinvocation), the injected pod is left alone.
    let mut again = review.clone();
    again["request"]["object"] = pod;
    let answer = post(&w, &pki.ca_path, "/inject/namespace", &again);
    assert_eq!(answer["response"], json!({"uid": review["request"]["uid"], "allowed": true}));

    // A pod that could flush the redirect is refused, saying why.
    let mut bad = review.clone();
    bad["request"]["object"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_ADMIN"]);
    let answer = post(&w, &pki.ca_path, "/inject/namespace", &bad);
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("`agent` adds the capability NET_ADMIN"), "{message}");

    // Not opted in (pod scope, no label or annotation): admitted untouched.
    let answer = post(&w, &pki.ca_path, "/inject/pod", &review);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // Bad input gets a readable status, and the webhook keeps serving.
    let resolve = format!("webhook.test:{}:127.0.0.1", w.addr.port());
    let base = format!("https://webhook.test:{}", w.addr.port());
    let status = |extra: &[&str], path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--noproxy", "*", "--resolve", &resolve, "--cacert"])
            .arg(&pki.ca_path)
            .args(extra)
            .arg(format!("{base}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status(&["--data-binary", "not json"], "/inject/pod"), "400");
    assert_eq!(status(&["--data-binary", r#"{"apiVersion":"admission.k8s.io/v1beta1"}"#], "/inject/pod"), "400");
    assert_eq!(status(&[], "/elsewhere"), "404");
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; 5 << 20]).unwrap();
    assert_eq!(status(&["--data-binary", &format!("@{}", big.display())], "/inject/pod"), "413");
    assert_eq!(status(&[], "/healthz"), "200");

    // Every review is counted by verdict on the admin listener.
    let (code, metrics) = crate::support::proxy::http_get(w.admin, "/metrics");
    assert_eq!(code, 200);
    for (verdict, at_least) in [("injected", 1), ("unchanged", 2), ("refused", 1), ("invalid", 3)] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("sandgate_webhook_reviews_total{{verdict=\"{verdict}\"}}")))
            .unwrap_or_else(|| panic!("{verdict}: {metrics}"));
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= at_least, "{line}");
    }

    // A renewed certificate (cert-manager rewrites the files) is served without a restart.
    let renewed = Pki::new();
    std::thread::sleep(Duration::from_millis(20));
    renewed.leaf_files(&["webhook.test"], dir.path());
    let answer = post(&w, &renewed.ca_path, "/inject/pod", &review);
    assert_eq!(answer["response"]["allowed"], true);
}

/// The injected containers work together as the kubelet would run them (root): the init
/// container's command in a namespace playing the pod, then the sidecar's command as its UID
/// (policy path pointed at a local file), its startup probe polled, and the app's traffic
/// reaching an allowed origin through the redirect with the app's injected environment.
#[test]
fn the_injected_commands_work_together() {
    use crate::support::netns::{GW_IP, Topology, privileged};
    if !privileged("the_injected_commands_work_together") {
        return;
    }
    let review: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let config = sandgate_sidecar::webhook::InjectConfig::new("sandgate", "sandgate-init");
    let sandgate_sidecar::webhook::Verdict::Patch(ops) = sandgate_sidecar::webhook::mutate(
        &review["request"]["object"],
        sandgate_sidecar::webhook::Scope::Namespace,
        &config,
    ) else {
        panic!("not injected")
    };
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).unwrap()).unwrap();
    let args = |i: usize| -> Vec<String> {
        pod["spec"]["initContainers"][i]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let (init_args, mut proxy_args) = (args(0), args(1));

    let t = Topology::new();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _enter = rt.enter();
    let origin = crate::support::origin::serve(
        tokio::net::TcpListener::from_std(t.bind_in_gw(&format!("{GW_IP}:0"))).unwrap(),
        "plain",
        None,
    );
    let port = origin.addr.port();

    // 1. The init container.
    let bin = sandgate_bin();
    let out =
        t.in_sbx(&[&[bin.to_str().unwrap()], &init_args.iter().map(String::as_str).collect::<Vec<_>>()[..]].concat());
    assert!(out.status.success(), "init {init_args:?}: {}", String::from_utf8_lossy(&out.stderr));

    // 2. The sidecar, as its UID, with the policy where its ConfigMap would be mounted.
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!("version: 1\nresolve:\n  origin.test: [{GW_IP}]\nallow:\n  - hosts: [origin.test]\n    ports: [{port}]\n  - cidrs: [{GW_IP}/32]\n    ports: [{port}]\n"),
    )
    .unwrap();
    let at = proxy_args.iter().position(|a| a == "--policy").unwrap();
    assert_eq!(proxy_args[at + 1], "/etc/sandgate/policy/policy.yaml", "the ConfigMap's mount path");
    proxy_args[at + 1] = policy.display().to_string();
    let uid = pod["spec"]["initContainers"][1]["securityContext"]["runAsUser"].to_string();
    let mut proxy = Command::new("ip")
        .args(["netns", "exec", &t.sbx, "setpriv", "--reuid", &uid, "--regid", &uid, "--clear-groups"])
        .arg(&bin)
        .args(&proxy_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // 3. The startup probe, as the kubelet polls it (from outside the pod, on the pod's address).
    let probe = &pod["spec"]["initContainers"][1]["startupProbe"]["httpGet"];
    let url = format!("http://10.213.0.2:{}{}", probe["port"], probe["path"].as_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ip").args(["netns", "exec", &t.gw, "curl", "-s", "-m", "2", &url]).output().unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("ready") {
            break;
        }
        assert!(Instant::now() < deadline, "the startup probe {url} never passed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // 4. The app, with its injected environment, reaches the origin through the redirect.
    let env: Vec<String> = pod["spec"]["containers"][1]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}={}", e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    let resolve = format!("origin.test:{port}:{GW_IP}");
    let target = format!("http://origin.test:{port}/injected");
    let mut argv: Vec<&str> = vec!["env"];
    argv.extend(env.iter().map(String::as_str));
    argv.extend(["curl", "-s", "-S", "-m", "10", "--noproxy", "*", "--resolve", &resolve, &target]);
    let out = t.in_sbx(&argv);
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("origin plain GET /injected"), "{body}{}", String::from_utf8_lossy(&out.stderr));
    // 5. DNS: whatever resolver the pod is given, its queries reach the sidecar, which answers
    //    allowed names and refuses the rest.
    let by_name = format!("http://origin.test:{port}/by-name");
    let out = t.in_sbx(&["curl", "-s", "-S", "-m", "10", "--noproxy", "*", &by_name]);
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("origin plain GET /by-name"), "{body}{}", String::from_utf8_lossy(&out.stderr));
    let out = t.in_sbx(&["curl", "-s", "-S", "-m", "10", "--noproxy", "*", "http://exfil.example.test/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("resolve"), "{err}");
    let _ = proxy.kill();
    let _ = proxy.wait();
}
