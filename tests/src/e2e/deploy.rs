//! deploy/ checked offline: every kustomization renders with `kubectl kustomize` and passes
//! `kubernetes-validate --strict`; the properties the threat model rests on are asserted on
//! the rendered objects (webhooks fail closed, least-privilege roles, traffic kept on the
//! node, non-root read-only containers); the systemd unit passes `systemd-analyze verify`;
//! the Grafana dashboard only queries metrics the proxy exports.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::k8s;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `kubectl kustomize DIR`, validated, as JSON objects.
fn render(dir: &str) -> Vec<Value> {
    let path = deploy().join("kubernetes").join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .expect("kubectl is installed (scripts/setup says where to get it)");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).unwrap();
    k8s::validate(dir, &yaml);
    k8s::yaml_to_json(&yaml)
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn every_kustomization_renders_valid_objects() {
    let dirs = [
        "base",
        "sidecar-injection/base",
        "sidecar-injection/cert-manager",
        "node-agent",
        "agent-deployment",
        "provider",
        "monitoring",
    ];
    for dir in dirs {
        let objects = render(dir);
        assert!(!objects.is_empty(), "{dir}");
        let workloads = of_kind(&objects, "Deployment").into_iter().chain(of_kind(&objects, "DaemonSet"));
        let pod_specs = workloads.map(|w| (w, &w["spec"]["template"]["spec"])).chain(
            of_kind(&objects, "CronJob")
                .into_iter()
                .map(|c| (c, &c["spec"]["jobTemplate"]["spec"]["template"]["spec"])),
        );
        for (w, spec) in pod_specs {
            assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{dir}: {}", w["metadata"]["name"]);
            for c in spec["containers"].as_array().unwrap() {
                let sc = &c["securityContext"];
                assert_eq!(sc["allowPrivilegeEscalation"], false, "{dir}: {}", c["name"]);
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{dir}: {}", c["name"]);
                assert_eq!(sc["capabilities"]["drop"][0], "ALL", "{dir}: {}", c["name"]);
            }
        }
    }
}

#[test]
fn the_sidecar_webhook_fails_closed_with_or_without_cert_manager() {
    let objects = render("sidecar-injection/cert-manager");
    let config = of_kind(&objects, "MutatingWebhookConfiguration")[0];
    assert_eq!(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "sandgate-system/sandgate-webhook");
    for w in config["webhooks"].as_array().unwrap() {
        assert_eq!(w["failurePolicy"], "Fail", "{}", w["name"]);
        assert_eq!(w["sideEffects"], "None");
        assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    }
    let cert = of_kind(&objects, "Certificate")[0];
    assert_eq!(cert["spec"]["secretName"], "sandgate-webhook-tls");

    // Without cert-manager: the script makes the certificate and the CA bundle.
    let dir = deploy().join("kubernetes/sidecar-injection/manual-tls");
    let made = ["tls.crt", "tls.key", "ca-bundle.yaml"].map(|f| dir.join(f));
    let out = Command::new(dir.join("make-tls.sh")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let objects = render("sidecar-injection/manual-tls");
    for f in &made {
        let _ = std::fs::remove_file(f);
    }
    let config = of_kind(&objects, "MutatingWebhookConfiguration")[0];
    for w in config["webhooks"].as_array().unwrap() {
        assert!(w["clientConfig"]["caBundle"].as_str().is_some_and(|b| b.len() > 100), "{}", w["name"]);
    }
    let secret = of_kind(&objects, "Secret")[0];
    assert_eq!(secret["metadata"]["name"], "sandgate-webhook-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
}

#[test]
fn the_provider_role_grants_exactly_what_the_provider_does() {
    let objects = render("provider");
    let roles = of_kind(&objects, "Role");
    let role = roles.iter().find(|r| r["metadata"]["name"] == "sandgate-provider").unwrap();
    let mut granted: Vec<String> = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        for r in rule["resources"].as_array().unwrap() {
            for v in rule["verbs"].as_array().unwrap() {
                granted.push(format!(
                    "{}/{} {}",
                    rule["apiGroups"][0].as_str().unwrap(),
                    r.as_str().unwrap(),
                    v.as_str().unwrap()
                ));
            }
        }
    }
    granted.sort();
    // The verbs `sandgate kube` uses (provider.rs NEEDED); `kube test` checks the same list.
    let mut needed: Vec<String> = [
        "/configmaps create",
        "/configmaps get",
        "/configmaps list",
        "/configmaps delete",
        "/pods create",
        "/pods get",
        "/pods list",
        "/pods delete",
        "/persistentvolumeclaims create",
        "/persistentvolumeclaims list",
        "/persistentvolumeclaims delete",
        "networking.k8s.io/networkpolicies create",
        "networking.k8s.io/networkpolicies list",
        "networking.k8s.io/networkpolicies delete",
    ]
    .map(str::to_owned)
    .to_vec();
    needed.sort();
    assert_eq!(granted, needed);
    // The cluster-side reaper may only list and delete.
    let reaper = roles.iter().find(|r| r["metadata"]["name"] == "sandgate-reaper").unwrap();
    for rule in reaper["rules"].as_array().unwrap() {
        assert_eq!(rule["verbs"], serde_json::json!(["list", "delete"]));
    }
    let cron = of_kind(&objects, "CronJob")[0];
    let args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--in-cluster") && args.contains("reap"), "{args}");
    let deny = of_kind(&objects, "NetworkPolicy")[0];
    assert_eq!(deny["spec"]["podSelector"], serde_json::json!({}));
    assert_eq!(deny["spec"]["policyTypes"], serde_json::json!(["Ingress", "Egress"]));
    assert!(deny["spec"].get("ingress").is_none() && deny["spec"].get("egress").is_none());
}

#[test]
fn the_node_agent_keeps_traffic_on_the_node_and_only_reads_pods() {
    let objects = render("node-agent");
    let svc = of_kind(&objects, "Service")[0];
    assert_eq!(svc["spec"]["internalTrafficPolicy"], "Local");
    let role = of_kind(&objects, "ClusterRole")[0];
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}])
    );
    let ds = of_kind(&objects, "DaemonSet")[0];
    let env = ds["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains("SANDGATE_NODE_NAME") && env.contains("spec.nodeName"), "{env}");
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(deploy().join("systemd/sandgate-agent.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sandgate-agent.service");
    let bin = crate::support::proxy::sandgate_bin();
    std::fs::write(&path, unit.replace("/usr/local/bin/sandgate", bin.to_str().unwrap())).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("sandgate-agent.service"), "{stderr}");
}

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let text = std::fs::read_to_string(deploy().join("kubernetes/monitoring/sandgate-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let metrics = ["proxy/src/metrics.rs", "control/src/webhook.rs"]
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .join("\n");
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 4);
    for p in panels {
        let expr = p["targets"][0]["expr"].as_str().unwrap();
        let name = expr
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| w.starts_with("sandgate_"))
            .unwrap();
        let base = name.trim_end_matches("_bucket");
        assert!(metrics.contains(&format!("\"{base}\"")), "{}: {base} is not a metric the proxy exports", p["title"]);
    }
}

/// Every flag a manifest, the systemd unit or the webhook's injected containers pass to
/// `sandgate` is one the binary's `--help` for that command lists (a renamed flag would
/// otherwise only show in a crash loop on a cluster).
#[test]
fn every_flag_deploy_passes_exists() {
    let mut commands: Vec<(String, Vec<String>)> = Vec::new();
    for dir in ["sidecar-injection/base", "node-agent", "agent-deployment", "provider"] {
        for o in render(dir) {
            let spec = match o["kind"].as_str() {
                Some("Deployment" | "DaemonSet") => &o["spec"]["template"]["spec"],
                Some("CronJob") => &o["spec"]["jobTemplate"]["spec"]["template"]["spec"],
                _ => continue,
            };
            for c in spec["containers"].as_array().unwrap() {
                let args: Vec<String> =
                    c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
                commands.push((format!("{dir} {}", c["name"]), args));
            }
        }
    }
    let unit = std::fs::read_to_string(deploy().join("systemd/sandgate-agent.service")).unwrap();
    let exec = unit.lines().skip_while(|l| !l.starts_with("ExecStart=")).take_while(|l| !l.starts_with("ExecReload"));
    let words: Vec<String> =
        exec.flat_map(|l| l.split_whitespace()).filter(|w| *w != "\\").map(str::to_owned).collect();
    commands.push(("systemd unit".into(), words[1..].to_vec()));
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).unwrap();
    for cmd in dockerfile.lines().filter_map(|l| l.strip_prefix("CMD ")) {
        let args: Vec<String> = serde_json::from_str(cmd).unwrap();
        commands.push(("Dockerfile CMD".into(), args));
    }
    // The sidecar's two containers as the webhook injects them.
    let review: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../sidecar/tests/fixtures/admission/pod-create.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let config = sandgate_sidecar::webhook::InjectConfig {
        vault_secret: Some("v".into()),
        ..sandgate_sidecar::webhook::InjectConfig::new("i", "i")
    };
    let sandgate_sidecar::webhook::Verdict::Patch(ops) = sandgate_sidecar::webhook::mutate(
        &review["request"]["object"],
        sandgate_sidecar::webhook::Scope::Namespace,
        &config,
    ) else {
        panic!("not injected")
    };
    for op in ops.iter().filter(|o| o["value"]["args"].is_array()) {
        let args = op["value"]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
        commands.push((format!("injected {}", op["value"]["name"]), args));
    }
    assert!(commands.len() >= 7, "{commands:?}");
    let bin = crate::support::proxy::sandgate_bin();
    for (what, args) in commands {
        let sub = &args[0];
        let help = Command::new(&bin).args([sub.as_str(), "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for flag in args.iter().filter(|a| a.starts_with("--")) {
            assert!(
                help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                "{what}: `sandgate {sub}` has no {flag}"
            );
        }
    }
}
