//! The injector against a real AdmissionReview document: the patch applied with a JSON-patch
//! library, idempotence, every refusal, and pods that are not opted in.

use serde_json::{Value, json};

use super::*;

fn config() -> InjectConfig {
    InjectConfig {
        vault_secret: Some("sandgate-vault".into()),
        ..InjectConfig::new("ghcr.io/sandgate/sandgate:0.1.0", "ghcr.io/sandgate/sandgate-init:0.1.0")
    }
}

fn request() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/admission/pod-create.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The request with its pod changed by `f`.
fn with_pod(f: impl FnOnce(&mut Value)) -> Value {
    let mut r = request();
    f(&mut r["request"]["object"]);
    r
}

/// The pod after the webhook's patch, as the API server would store it.
fn injected(request: &Value, scope: Scope) -> Value {
    let (response, verdict) = review(request, scope, &config()).unwrap();
    assert!(matches!(verdict, Verdict::Patch(_)), "{verdict:?}");
    let r = &response["response"];
    assert_eq!(r["uid"], request["request"]["uid"]);
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect()
}

#[test]
fn a_pod_in_an_opted_in_namespace_gets_the_sidecar() {
    let pod = injected(&request(), Scope::Namespace);
    let spec = &pod["spec"];
    // Redirect first, then the proxy as a native sidecar, then the pod's own init containers.
    assert_eq!(names(&spec["initContainers"]), [INIT_NAME, PROXY_NAME, "fetch-tools"]);
    let init = &spec["initContainers"][0];
    assert_eq!(init["args"][0], "init");
    assert_eq!(init["image"], "ghcr.io/sandgate/sandgate-init:0.1.0");
    assert_eq!(init["securityContext"]["capabilities"]["add"], json!(["NET_ADMIN", "NET_RAW"]));
    let proxy = &spec["initContainers"][1];
    assert_eq!(proxy["restartPolicy"], "Always");
    assert_eq!(proxy["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(proxy["securityContext"]["runAsUser"], 4750);
    assert!(proxy["volumeMounts"].to_string().contains("sandgate-vault"));
    // The policy and the CA come from ConfigMaps; the vault from a Secret only the proxy mounts.
    assert_eq!(names(&spec["volumes"]), ["sandgate-policy", "sandgate-ca", "sandgate-vault"]);
    for c in spec["containers"].as_array().unwrap().iter().chain([&spec["initContainers"][2]]) {
        assert!(!c.to_string().contains("sandgate-vault"), "{c}");
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/etc/sandgate/ca");
        let env = &c["env"];
        for var in TRUST_VARS {
            assert!(env.as_array().unwrap().iter().any(|e| e["name"] == var), "{var} missing in {c}");
        }
    }
    // A variable the container set itself is kept, not doubled.
    let agent = &spec["containers"][0];
    let ssl: Vec<&Value> = agent["env"].as_array().unwrap().iter().filter(|e| e["name"] == "SSL_CERT_FILE").collect();
    assert_eq!(ssl, [&json!({"name": "SSL_CERT_FILE", "value": "/etc/ssl/custom.pem"})]);
    // Capabilities: kept where the container says something, all dropped where it says nothing.
    assert_eq!(agent["securityContext"]["capabilities"], json!({"add": ["CHOWN"], "drop": ["ALL"]}));
    assert_eq!(agent["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        spec["containers"][1]["securityContext"],
        json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(pod["metadata"]["annotations"][INJECTED_KEY], env!("CARGO_PKG_VERSION"));
    assert_eq!(pod["metadata"]["labels"][SIDECAR_LABEL], "injected");
    assert_eq!(pod["metadata"]["labels"]["app"], "agent", "the pod's own labels are kept");
}

#[test]
fn injecting_twice_adds_nothing() {
    let pod = injected(&request(), Scope::Namespace);
    let again = with_pod(|p| *p = pod.clone());
    let (response, verdict) = review(&again, Scope::Namespace, &config()).unwrap();
    assert_eq!(verdict, Verdict::Unchanged("already injected"));
    assert_eq!(response["response"], json!({"uid": again["request"]["uid"], "allowed": true}));
}

#[test]
fn a_pod_without_init_containers_or_annotations_gets_them() {
    let r = with_pod(|p| {
        p["spec"].as_object_mut().unwrap().remove("initContainers");
        p["metadata"]["labels"][INJECT_KEY] = json!("enabled");
    });
    let pod = injected(&r, Scope::Pod);
    assert_eq!(names(&pod["spec"]["initContainers"]), [INIT_NAME, PROXY_NAME]);
    let r = with_pod(|p| {
        p["metadata"].as_object_mut().unwrap().remove("labels");
    });
    assert_eq!(injected(&r, Scope::Namespace)["metadata"]["labels"], json!({SIDECAR_LABEL: "injected"}));
}

#[test]
fn opting_in_and_out() {
    // Pod scope: only pods that ask (label or annotation) are injected.
    let (_, v) = review(&request(), Scope::Pod, &config()).unwrap();
    assert_eq!(v, Verdict::Unchanged("neither the pod nor its namespace opts in"));
    let r = with_pod(|p| p["metadata"]["annotations"] = json!({INJECT_KEY: "true"}));
    injected(&r, Scope::Pod);
    // A pod cannot opt itself out of an opted-in namespace.
    let r = with_pod(|p| p["metadata"]["annotations"] = json!({INJECT_KEY: "false"}));
    injected(&r, Scope::Namespace);
    // Not a pod creation: admitted unchanged.
    let mut r = request();
    r["request"]["operation"] = json!("UPDATE");
    assert_eq!(review(&r, Scope::Namespace, &config()).unwrap().1, Verdict::Unchanged("not a pod being created"));
}

#[test]
fn pods_that_could_bypass_the_proxy_are_refused() {
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "adds the capability NET_ADMIN",
            Box::new(|p| {
                p["spec"]["containers"][1]["securityContext"] = json!({"capabilities": {"add": ["NET_ADMIN"]}})
            }),
        ),
        (
            "adds the capability NET_RAW",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_RAW"])),
        ),
        (
            "adds the capability CAP_SETUID",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["CAP_SETUID"])),
        ),
        (
            "adds the capability setgid",
            Box::new(|p| {
                p["spec"]["initContainers"][0]["securityContext"] = json!({"capabilities": {"add": ["setgid"]}})
            }),
        ),
        (
            "adds the capability ALL",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["ALL"])),
        ),
        ("is privileged", Box::new(|p| p["spec"]["containers"][1]["securityContext"] = json!({"privileged": true}))),
        (
            "allows privilege escalation",
            Box::new(|p| p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true)),
        ),
        ("hostNetwork: true", Box::new(|p| p["spec"]["hostNetwork"] = json!(true))),
        ("runs as UID 4750", Box::new(|p| p["spec"]["containers"][0]["securityContext"]["runAsUser"] = json!(4750))),
        // The pod-level UID counts for containers that do not set their own.
        ("container `helper` runs as UID 4750", Box::new(|p| p["spec"]["securityContext"]["runAsUser"] = json!(4750))),
    ];
    for (why, change) in cases {
        let r = with_pod(|p| change(p));
        let (response, verdict) = review(&r, Scope::Namespace, &config()).unwrap();
        let Verdict::Refuse(message) = verdict else { panic!("{why}: admitted: {verdict:?}") };
        assert!(message.contains(why), "{why}: {message}");
        assert_eq!(response["response"]["allowed"], false);
        assert_eq!(response["response"]["status"]["code"], 403);
        assert_eq!(response["response"]["status"]["message"], message.as_str());
        assert!(response["response"].get("patch").is_none());
    }
}

#[test]
fn look_alike_sidecars_are_not_believed() {
    // A pod that names a harmless container `sandgate-proxy` and carries the annotation is
    // still injected (the API server then refuses the duplicate name: the pod never runs
    // without the real sidecar).
    let r = with_pod(|p| {
        p["metadata"]["annotations"] = json!({INJECTED_KEY: "0.1.0"});
        p["spec"]["initContainers"][0]["name"] = json!(PROXY_NAME);
    });
    let (_, v) = review(&r, Scope::Namespace, &config()).unwrap();
    assert!(matches!(v, Verdict::Patch(_)), "{v:?}");
    // A look-alike `sandgate-init` with NET_ADMIN is an app container that adds NET_ADMIN.
    let r = with_pod(|p| {
        p["spec"]["initContainers"][0]["name"] = json!(INIT_NAME);
        p["spec"]["initContainers"][0]["securityContext"] = json!({"capabilities": {"add": ["NET_ADMIN"]}});
    });
    let (_, v) = review(&r, Scope::Namespace, &config()).unwrap();
    let Verdict::Refuse(why) = v else { panic!("admitted a look-alike init: {v:?}") };
    assert!(why.contains("`sandgate-init` adds the capability NET_ADMIN"), "{why}");
    // The genuine pair, reinvoked with a bypassing app container added by a later webhook,
    // is refused rather than waved through as "already injected".
    let mut pod = injected(&request(), Scope::Namespace);
    pod["spec"]["containers"][1]["securityContext"]["privileged"] = json!(true);
    let again = with_pod(|p| *p = pod.clone());
    assert!(matches!(review(&again, Scope::Namespace, &config()).unwrap().1, Verdict::Refuse(_)));
}

#[test]
fn ephemeral_containers_that_could_bypass_an_injected_pod_are_refused() {
    let pod = injected(&request(), Scope::Namespace);
    let debug = |sc: Value| {
        let mut r = request();
        r["request"]["operation"] = json!("UPDATE");
        r["request"]["subResource"] = json!("ephemeralcontainers");
        let mut p = pod.clone();
        p["spec"]["ephemeralContainers"] = json!([{"name": "debugger", "image": "busybox", "securityContext": sc}]);
        r["request"]["object"] = p;
        review(&r, Scope::Namespace, &config()).unwrap().1
    };
    // `kubectl debug --profile=sysadmin` makes the container privileged.
    let Verdict::Refuse(why) = debug(json!({"privileged": true})) else { panic!("admitted a privileged debugger") };
    assert!(why.contains("ephemeral container `debugger` is privileged"), "{why}");
    assert!(matches!(debug(json!({"capabilities": {"add": ["NET_ADMIN"]}})), Verdict::Refuse(_)));
    assert_eq!(debug(json!({})), Verdict::Unchanged("ephemeral containers cannot bypass the sidecar"));
    // A pod that was never injected is not Sandgate's business.
    let mut r = request();
    r["request"]["operation"] = json!("UPDATE");
    r["request"]["subResource"] = json!("ephemeralcontainers");
    r["request"]["object"]["spec"]["ephemeralContainers"] =
        json!([{"name": "d", "image": "b", "securityContext": {"privileged": true}}]);
    assert_eq!(review(&r, Scope::Namespace, &config()).unwrap().1, Verdict::Unchanged("not an injected pod"));
}

#[test]
fn a_document_that_is_not_a_review_is_an_error() {
    assert!(review(&json!({"apiVersion": "admission.k8s.io/v1beta1"}), Scope::Pod, &config()).is_err());
    assert!(review(&json!({"apiVersion": "admission.k8s.io/v1", "request": {}}), Scope::Pod, &config()).is_err());
}

mod properties {
    //! Any pod shape: the patch applies, injects once, and leaves every app container with the
    //! trust variables exactly once and a capability drop list.

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::*;
    use super::config;

    fn security_context() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            Just(None),
            Just(Some(json!({}))),
            Just(Some(json!({"capabilities": {}}))),
            Just(Some(json!({"capabilities": {"add": ["CHOWN"]}}))),
            Just(Some(json!({"capabilities": {"drop": ["NET_RAW"]}}))),
            Just(Some(json!({"allowPrivilegeEscalation": false, "runAsUser": 1000}))),
        ]
    }

    fn container(name: String) -> impl Strategy<Value = Value> {
        let env = prop::collection::vec(prop_oneof![Just("SSL_CERT_FILE"), Just("MODE"), Just("GIT_SSL_CAINFO")], 0..3);
        (env, any::<bool>(), security_context()).prop_map(move |(env, mounts, sc)| {
            let mut c = json!({"name": name, "image": "busybox"});
            if !env.is_empty() {
                let mut seen = Vec::new();
                let vars: Vec<Value> = env
                    .into_iter()
                    .filter(|v| {
                        !seen.contains(v) && {
                            seen.push(*v);
                            true
                        }
                    })
                    .map(|v| json!({"name": v, "value": "x"}))
                    .collect();
                c["env"] = json!(vars);
            }
            if mounts {
                c["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
            }
            if let Some(sc) = sc {
                c["securityContext"] = sc;
            }
            c
        })
    }

    fn pod() -> impl Strategy<Value = Value> {
        let containers =
            (1usize..4).prop_flat_map(|n| (0..n).map(|i| container(format!("app{i}"))).collect::<Vec<_>>());
        let inits = (0usize..3).prop_flat_map(|n| (0..n).map(|i| container(format!("init{i}"))).collect::<Vec<_>>());
        (containers, inits, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(cs, is, labels, annotations, volumes)| {
                let mut p =
                    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": cs}});
                if !is.is_empty() {
                    p["spec"]["initContainers"] = json!(is);
                }
                if labels {
                    p["metadata"]["labels"] = json!({"app": "x"});
                }
                if annotations {
                    p["metadata"]["annotations"] = json!({"note": "y"});
                }
                if volumes {
                    p["spec"]["volumes"] = json!([{"name": "data", "emptyDir": {}}]);
                }
                p
            },
        )
    }

    proptest! {
        #[test]
        fn any_pod_is_injected_once_and_completely(pod in pod()) {
            let Verdict::Patch(ops) = mutate(&pod, Scope::Namespace, &config()) else {
                return Err(TestCaseError::fail("not injected"));
            };
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
            let mut out = pod.clone();
            json_patch::patch(&mut out, &patch).unwrap();
            prop_assert_eq!(mutate(&out, Scope::Namespace, &config()), Verdict::Unchanged("already injected"));
            let inits = out["spec"]["initContainers"].as_array().unwrap();
            prop_assert_eq!(&inits[0]["name"], INIT_NAME);
            prop_assert_eq!(&inits[1]["name"], PROXY_NAME);
            let apps = out["spec"]["containers"].as_array().unwrap().iter().chain(&inits[2..]);
            for c in apps {
                for var in TRUST_VARS {
                    let n = c["env"].as_array().unwrap().iter().filter(|e| e["name"] == var).count();
                    prop_assert_eq!(n, 1, "{} in {}", var, c);
                }
                prop_assert!(c["securityContext"]["capabilities"]["drop"].is_array(), "{}", c);
                prop_assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["name"] == "sandgate-ca"));
            }
            let volumes = out["spec"]["volumes"].as_array().unwrap();
            prop_assert_eq!(volumes.iter().filter(|v| v["name"] == "sandgate-ca").count(), 1);
        }
    }
}
