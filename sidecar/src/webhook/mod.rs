//! The sidecar injector's decision, pure over JSON: an AdmissionReview v1 request for a pod in,
//! the AdmissionReview response out (a JSON patch, a refusal, or nothing to do). The TLS server
//! around it is `sandgate webhook`.
//!
//! A pod opted in (its namespace through the webhook configuration, or its own label or
//! annotation `sandgate.dev/inject`; a pod cannot opt itself out of an opted-in namespace) gets `sandgate init` as the first init container, the proxy
//! as a native sidecar (an init container with `restartPolicy: Always` and a startup probe on
//! `/readyz`, so no other container starts before the proxy is ready), the policy from a
//! ConfigMap, and the CA with the trust variables in every app container. App containers that
//! say nothing about capabilities drop all of them and may not escalate privileges.
//!
//! Refused, with the reason: any app container that could undo the redirect (privileged, adds
//! NET_ADMIN, NET_RAW, SETUID, SETGID or ALL, allows privilege escalation, runs as the proxy's
//! UID) and host networking.
//! A pod already injected (both containers exactly as this webhook makes them) is left alone,
//! so reinvocation adds nothing twice; look-alike containers are not believed.

use serde_json::{Map, Value, json};

/// The label and annotation that opt a pod in (`enabled`/`true`).
pub const INJECT_KEY: &str = "sandgate.dev/inject";
/// The annotation the injector leaves on a pod it changed.
pub const INJECTED_KEY: &str = "sandgate.dev/injected";
/// The label it adds, so a PodMonitor can scrape every sidecar (value `injected`).
pub const SIDECAR_LABEL: &str = "sandgate.dev/sidecar";
/// The injected init container that installs the redirect.
pub const INIT_NAME: &str = "sandgate-init";
/// The injected proxy (a native sidecar).
pub const PROXY_NAME: &str = "sandgate-proxy";
/// Where app containers find Sandgate's CA certificate.
pub const CA_PATH: &str = "/etc/sandgate/ca/ca.crt";
/// The variables that point TLS clients at the CA (curl, OpenSSL, git, Node, Python requests).
pub const TRUST_VARS: [&str; 5] =
    ["SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE"];
/// Capabilities that would let a workload undo the redirect or become the proxy's UID.
const BYPASS_CAPS: [&str; 5] = ["NET_ADMIN", "NET_RAW", "SETUID", "SETGID", "ALL"];

/// What the injected containers look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectConfig {
    /// The Sandgate image the proxy runs from.
    pub image: String,
    /// The image `sandgate init` runs from (it needs nft and iptables-legacy).
    pub init_image: String,
    /// The UID the proxy runs as (exempt from the redirect; refused for app containers).
    pub proxy_uid: u32,
    /// The proxy's explicit port (for tools that honour `HTTPS_PROXY`).
    pub explicit_port: u16,
    /// The proxy's transparent port (where `sandgate init` redirects TCP).
    pub transparent_port: u16,
    /// The proxy's admin port (`/readyz` for the startup probe, `/metrics`).
    pub admin_port: u16,
    /// The proxy's DNS port.
    pub dns_port: u16,
    /// The ConfigMap with the policy (key `policy.yaml`).
    pub policy_configmap: String,
    /// The ConfigMap with the CA certificate (key `ca.crt`).
    pub ca_configmap: String,
    /// The Secret with the vault (keys `vault.json`, `vault.key`), mounted only into the proxy;
    /// needed when the policy intercepts hosts to inject credentials.
    pub vault_secret: Option<String>,
}

// === impl InjectConfig ===

impl InjectConfig {
    /// The injection with Sandgate's default UID, ports and ConfigMap names, and no vault.
    pub fn new(image: impl Into<String>, init_image: impl Into<String>) -> Self {
        use crate::redirect::{
            DEFAULT_ADMIN_PORT, DEFAULT_DNS_PORT, DEFAULT_EXPLICIT_PORT, DEFAULT_PROXY_UID, DEFAULT_TRANSPARENT_PORT,
        };
        Self {
            image: image.into(),
            init_image: init_image.into(),
            proxy_uid: DEFAULT_PROXY_UID,
            explicit_port: DEFAULT_EXPLICIT_PORT,
            transparent_port: DEFAULT_TRANSPARENT_PORT,
            admin_port: DEFAULT_ADMIN_PORT,
            dns_port: DEFAULT_DNS_PORT,
            policy_configmap: "sandgate-policy".into(),
            ca_configmap: "sandgate-ca".into(),
            vault_secret: None,
        }
    }
}

/// Whether the webhook configuration selected the pod by its namespace's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The namespace opted in: every pod is injected.
    Namespace,
    /// Only pods that opt in themselves (label or annotation) are injected.
    Pod,
}

/// What the webhook decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Admit unchanged (not opted in, already injected, or not a pod).
    Unchanged(&'static str),
    /// Admit with this JSON patch.
    Patch(Vec<Value>),
    /// Refuse, with the message the user sees.
    Refuse(String),
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// Not an AdmissionReview v1 request.
    #[error("not an admission.k8s.io/v1 AdmissionReview request: {0}")]
    NotAReview(&'static str),
}

/// Answers one AdmissionReview request document with the response document.
pub fn review(request: &Value, scope: Scope, config: &InjectConfig) -> Result<(Value, Verdict), ReviewError> {
    if request.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1") {
        return Err(ReviewError::NotAReview("apiVersion must be admission.k8s.io/v1"));
    }
    let req = request.get("request").ok_or(ReviewError::NotAReview("no `request`"))?;
    let uid = req.get("uid").and_then(Value::as_str).ok_or(ReviewError::NotAReview("no `request.uid`"))?;
    let is_pod = req.pointer("/kind/kind").and_then(Value::as_str) == Some("Pod")
        && req.pointer("/kind/group").and_then(Value::as_str).unwrap_or("").is_empty();
    let operation = req.get("operation").and_then(Value::as_str);
    let subresource = req.get("subResource").and_then(Value::as_str).unwrap_or("");
    let verdict = match req.get("object") {
        Some(pod) if is_pod && operation == Some("CREATE") && subresource.is_empty() => mutate(pod, scope, config),
        // `kubectl debug` adds ephemeral containers to a running pod: one with NET_ADMIN or
        // privilege could flush the redirect, so an injected pod gets none that could.
        Some(pod) if is_pod && operation == Some("UPDATE") && subresource == "ephemeralcontainers" => {
            ephemeral(pod, config)
        }
        _ => Verdict::Unchanged("not a pod being created"),
    };
    let mut response = json!({ "uid": uid, "allowed": true });
    match &verdict {
        Verdict::Unchanged(_) => {}
        Verdict::Patch(ops) => {
            use base64::Engine;
            let patch = serde_json::to_vec(ops).unwrap_or_default();
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        Verdict::Refuse(message) => {
            response["allowed"] = json!(false);
            response["status"] = json!({ "code": 403, "reason": "Forbidden", "message": message });
        }
    }
    let doc = json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response });
    Ok((doc, verdict))
}

/// The decision for one pod.
///
/// Nothing on the pod can switch Sandgate off: in an opted-in namespace every pod is injected,
/// and a pod that looks injected is believed only if both of Sandgate's containers are exactly
/// what this webhook would inject (a forged `sandgate-proxy` is an app container like any other,
/// and injecting beside it makes the API server refuse the duplicate name: fail closed).
pub fn mutate(pod: &Value, scope: Scope, config: &InjectConfig) -> Verdict {
    let opt =
        |section: &str| pod.pointer(&format!("/metadata/{section}/{}", escape(INJECT_KEY))).and_then(Value::as_str);
    let opted_in = [opt("labels"), opt("annotations")].into_iter().flatten().any(|v| v == "true" || v == "enabled");
    if scope == Scope::Pod && !opted_in {
        return Verdict::Unchanged("neither the pod nor its namespace opts in");
    }
    let spec = pod.get("spec").cloned().unwrap_or_else(|| json!({}));
    let injected = genuinely_injected(&spec, config);
    if let Some(why) = bypass(&spec, config, false) {
        return Verdict::Refuse(format!(
            "sandgate: refusing this pod: {why}, which could bypass the egress proxy. Remove it, or run \
             the pod in a namespace without {INJECT_KEY}=enabled (it then gets no egress control)."
        ));
    }
    if injected {
        return Verdict::Unchanged("already injected");
    }
    Verdict::Patch(patch(pod, &spec, config))
}

/// Whether the pod carries both of Sandgate's containers exactly as this webhook makes them.
fn genuinely_injected(spec: &Value, config: &InjectConfig) -> bool {
    let inits = spec.get("initContainers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    [init_container(config), proxy_container(config)].iter().all(|ours| inits.iter().any(|c| is_ours(c, ours)))
}

/// Whether `c` is the injected container `ours` (the API server may have added defaults).
fn is_ours(c: &Value, ours: &Value) -> bool {
    ["name", "image", "args", "securityContext", "restartPolicy"].iter().all(|k| c.get(*k) == ours.get(*k))
}

/// The decision for ephemeral containers added to a running pod (`kubectl debug`): on a pod
/// Sandgate injected, none may be able to undo the redirect.
fn ephemeral(pod: &Value, config: &InjectConfig) -> Verdict {
    let spec = pod.get("spec").unwrap_or(&Value::Null);
    let annotated = pod.pointer(&format!("/metadata/annotations/{}", escape(INJECTED_KEY))).is_some();
    let inits = spec.get("initContainers").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let named = inits.iter().any(|c| c.get("name").and_then(Value::as_str) == Some(PROXY_NAME));
    if !annotated && !named {
        return Verdict::Unchanged("not an injected pod");
    }
    match bypass(spec, config, true) {
        Some(why) => Verdict::Refuse(format!(
            "sandgate: refusing this ephemeral container: {why}, which could bypass the egress proxy of an injected pod"
        )),
        None => Verdict::Unchanged("ephemeral containers cannot bypass the sidecar"),
    }
}

/// The first way a container of the pod could bypass the sidecar, in words. Sandgate's own
/// containers (when genuine) are exempt; `ephemeral_only` checks only ephemeral containers.
fn bypass(spec: &Value, config: &InjectConfig, ephemeral_only: bool) -> Option<String> {
    let proxy_uid = config.proxy_uid;
    if !ephemeral_only && spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        return Some("it uses the host's network (hostNetwork: true)".into());
    }
    let ours = [init_container(config), proxy_container(config)];
    let pod_uid = spec.pointer("/securityContext/runAsUser").and_then(Value::as_u64);
    for (kind, containers) in app_containers(spec) {
        if ephemeral_only && kind != "ephemeral container" {
            continue;
        }
        for c in containers.iter().filter(|c| !ours.iter().any(|o| is_ours(c, o))) {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
            let sc = c.get("securityContext");
            if sc.and_then(|s| s.get("privileged")).and_then(Value::as_bool) == Some(true) {
                return Some(format!("{kind} `{name}` is privileged"));
            }
            // A set-user-ID file owned by the proxy's UID would make a process that UID.
            if sc.and_then(|s| s.get("allowPrivilegeEscalation")).and_then(Value::as_bool) == Some(true) {
                return Some(format!("{kind} `{name}` allows privilege escalation (set-user-ID files)"));
            }
            let added = sc.and_then(|s| s.pointer("/capabilities/add")).and_then(Value::as_array);
            for cap in added.into_iter().flatten().filter_map(Value::as_str) {
                let bare = cap.trim_start_matches("CAP_").to_ascii_uppercase();
                if BYPASS_CAPS.contains(&bare.as_str()) {
                    return Some(format!("{kind} `{name}` adds the capability {cap}"));
                }
            }
            let uid = sc.and_then(|s| s.get("runAsUser")).and_then(Value::as_u64).or(pod_uid);
            if uid == Some(u64::from(proxy_uid)) {
                return Some(format!(
                    "{kind} `{name}` runs as UID {proxy_uid}, the proxy's own (exempt from the redirect)"
                ));
            }
        }
    }
    None
}

/// The pod's own containers, by kind.
fn app_containers(spec: &Value) -> impl Iterator<Item = (&'static str, &Vec<Value>)> {
    [("container", "containers"), ("init container", "initContainers"), ("ephemeral container", "ephemeralContainers")]
        .into_iter()
        .filter_map(|(kind, key)| spec.get(key).and_then(Value::as_array).map(|v| (kind, v)))
}

fn patch(pod: &Value, spec: &Value, config: &InjectConfig) -> Vec<Value> {
    let mut ops = Vec::new();
    // Annotations: mark the pod injected.
    let annotation = format!("/metadata/annotations/{}", escape(INJECTED_KEY));
    if pod.pointer("/metadata/annotations").is_some() {
        ops.push(json!({"op": "add", "path": annotation, "value": env!("CARGO_PKG_VERSION")}));
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/annotations",
            "value": { INJECTED_KEY: env!("CARGO_PKG_VERSION") }}));
    }
    if pod.pointer("/metadata/labels").is_some() {
        ops.push(
            json!({"op": "add", "path": format!("/metadata/labels/{}", escape(SIDECAR_LABEL)), "value": "injected"}),
        );
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/labels", "value": { SIDECAR_LABEL: "injected" }}));
    }
    // App containers first (indices refer to the pod as it came), then the injected ones.
    for (key, list) in [("containers", spec.get("containers")), ("initContainers", spec.get("initContainers"))] {
        for (i, c) in list.and_then(Value::as_array).into_iter().flatten().enumerate() {
            app_container(&mut ops, &format!("/spec/{key}/{i}"), c);
        }
    }
    let ours = [init_container(config), proxy_container(config)];
    if spec.get("initContainers").is_some() {
        for (i, c) in ours.into_iter().enumerate() {
            ops.push(json!({"op": "add", "path": format!("/spec/initContainers/{i}"), "value": c}));
        }
    } else {
        ops.push(json!({"op": "add", "path": "/spec/initContainers", "value": ours}));
    }
    let mut volumes = vec![
        json!({"name": "sandgate-policy", "configMap": {"name": config.policy_configmap}}),
        json!({"name": "sandgate-ca", "configMap": {"name": config.ca_configmap}}),
    ];
    if let Some(secret) = &config.vault_secret {
        volumes.push(json!({"name": "sandgate-vault", "secret": {"secretName": secret, "defaultMode": 0o400}}));
    }
    append(&mut ops, spec.get("volumes"), "/spec/volumes", volumes);
    ops
}

/// Trust variables, the CA mount, and (when the container says nothing) no capabilities and
/// no privilege escalation.
fn app_container(ops: &mut Vec<Value>, at: &str, c: &Value) {
    let has_env = |name: &str| {
        c.get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|e| e.get("name").and_then(Value::as_str) == Some(name))
    };
    let env: Vec<Value> =
        TRUST_VARS.iter().filter(|v| !has_env(v)).map(|v| json!({"name": v, "value": CA_PATH})).collect();
    append(ops, c.get("env"), &format!("{at}/env"), env);
    let mount = json!({"name": "sandgate-ca", "mountPath": "/etc/sandgate/ca", "readOnly": true});
    append(ops, c.get("volumeMounts"), &format!("{at}/volumeMounts"), vec![mount]);
    match c.get("securityContext") {
        None => ops.push(json!({"op": "add", "path": format!("{at}/securityContext"),
            "value": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}})),
        Some(sc) => {
            if sc.get("allowPrivilegeEscalation").is_none() {
                ops.push(json!({"op": "add", "path": format!("{at}/securityContext/allowPrivilegeEscalation"), "value": false}));
            }
            match sc.get("capabilities") {
                None => ops.push(json!({"op": "add", "path": format!("{at}/securityContext/capabilities"),
                    "value": {"drop": ["ALL"]}})),
                Some(caps) if caps.get("drop").is_none() => ops.push(json!({"op": "add",
                    "path": format!("{at}/securityContext/capabilities/drop"), "value": ["ALL"]})),
                Some(_) => {}
            }
        }
    }
}

/// Adds `items` to the array at `path`, creating it when `existing` is absent.
fn append(ops: &mut Vec<Value>, existing: Option<&Value>, path: &str, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if existing.is_some() {
        ops.extend(items.into_iter().map(|v| json!({"op": "add", "path": format!("{path}/-"), "value": v})));
    } else {
        ops.push(json!({"op": "add", "path": path, "value": items}));
    }
}

fn init_container(config: &InjectConfig) -> Value {
    json!({
        "name": INIT_NAME,
        "image": config.init_image,
        "args": ["init",
            "--proxy-uid", config.proxy_uid.to_string(),
            "--transparent-port", config.transparent_port.to_string(),
            "--dns-port", config.dns_port.to_string(),
            "--inbound-ports", config.admin_port.to_string()],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
        },
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
    })
}

fn proxy_container(config: &InjectConfig) -> Value {
    let mut args = vec![
        "proxy".to_owned(),
        "--policy".into(),
        "/etc/sandgate/policy/policy.yaml".into(),
        "--listen".into(),
        format!("127.0.0.1:{}", config.explicit_port),
        "--transparent".into(),
        format!("127.0.0.1:{}", config.transparent_port),
        "--dns".into(),
        format!("127.0.0.1:{}", config.dns_port),
        "--admin".into(),
        format!("0.0.0.0:{}", config.admin_port),
    ];
    let mut mounts = vec![json!({"name": "sandgate-policy", "mountPath": "/etc/sandgate/policy", "readOnly": true})];
    if config.vault_secret.is_some() {
        args.extend(["--vault".into(), "/etc/sandgate/vault/vault.json".into()]);
        args.extend(["--vault-key-file".into(), "/etc/sandgate/vault/vault.key".into()]);
        mounts.push(json!({"name": "sandgate-vault", "mountPath": "/etc/sandgate/vault", "readOnly": true}));
    }
    let mut c = Map::new();
    c.insert("name".into(), json!(PROXY_NAME));
    c.insert("image".into(), json!(config.image));
    c.insert("restartPolicy".into(), json!("Always"));
    c.insert("args".into(), json!(args));
    c.insert("env".into(), json!([{"name": "SANDGATE_LOG_FORMAT", "value": "json"}]));
    c.insert(
        "ports".into(),
        json!([{"name": "sandgate-admin", "containerPort": config.admin_port, "protocol": "TCP"}]),
    );
    c.insert(
        "startupProbe".into(),
        json!({"httpGet": {"path": "/readyz", "port": config.admin_port}, "periodSeconds": 1, "failureThreshold": 120}),
    );
    c.insert("readinessProbe".into(), json!({"httpGet": {"path": "/readyz", "port": config.admin_port}}));
    c.insert("livenessProbe".into(), json!({"httpGet": {"path": "/healthz", "port": config.admin_port}}));
    c.insert(
        "securityContext".into(),
        json!({
            "runAsUser": config.proxy_uid,
            "runAsGroup": config.proxy_uid,
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}
        }),
    );
    c.insert(
        "resources".into(),
        json!({"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}),
    );
    c.insert("volumeMounts".into(), json!(mounts));
    Value::Object(c)
}

/// A key escaped for a JSON pointer (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
