//! The objects the Kubernetes provider creates for one sandbox, as JSON (pure, no I/O): the
//! anchor ConfigMap that owns the rest, the NetworkPolicy, the workspace claim and the pod.
//! Every object carries the same labels and annotations, so one reaper finds them all.

use serde_json::{Value, json};

/// `app.kubernetes.io/managed-by` value on everything Sandgate creates.
pub(crate) const MANAGED_BY: &str = "sandgate";
/// The label selecting everything Sandgate manages.
pub(crate) const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=sandgate";
/// Label: the sandbox's id.
pub(crate) const SANDBOX_ID: &str = "sandgate.dev/sandbox-id";
/// Annotation: when the sandbox was created (RFC 3339).
pub(crate) const CREATED_AT: &str = "sandgate.dev/created-at";
/// Annotation: when the sandbox must be gone (RFC 3339).
pub(crate) const EXPIRES_AT: &str = "sandgate.dev/expires-at";
/// Annotation: the policy profile the proxy gives the sandbox.
pub(crate) const PROFILE: &str = "sandgate.dev/profile";
/// Annotation: SHA-256 (hex) of the sandbox's proxy token, which the node agent checks.
pub(crate) const TOKEN_SHA256: &str = "sandgate.dev/token-sha256";

/// How sandboxes are made in one cluster and namespace.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The namespace sandboxes live in.
    pub(crate) namespace: String,
    /// The runtime class (`gvisor` by default); `None` for the cluster's default runtime.
    pub(crate) runtime_class: Option<String>,
    /// The storage class for a workspace that survives pause; `None` for an `emptyDir`.
    pub(crate) storage_class: Option<String>,
    /// The sandbox image.
    pub(crate) image: String,
    /// The proxy as sandboxes reach it: `HOST:PORT` (an IP literal needs no DNS).
    pub(crate) proxy: String,
    /// The proxy pods, for the NetworkPolicy: their namespace and `app.kubernetes.io/name`.
    pub(crate) proxy_namespace: String,
    /// The proxy pods' `app.kubernetes.io/name` label.
    pub(crate) proxy_app: String,
    /// The ConfigMap holding Sandgate's CA certificate (`ca.crt`), mounted read-only.
    pub(crate) ca_configmap: String,
}

impl Target {
    /// The proxy's port, from `proxy` (the NetworkPolicy allows only this): 4750 if absent.
    pub(crate) fn proxy_port(&self) -> u16 {
        self.proxy.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap_or(4750)
    }
}

/// One sandbox's identity and limits.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    /// Short random id; object names are `sbx-<id>` and `ws-<id>`.
    pub(crate) id: String,
    /// The per-sandbox proxy token (in the proxy URL; only its hash is stored in the cluster
    /// outside the pod's own spec).
    pub(crate) token: String,
    /// The policy profile.
    pub(crate) profile: String,
    /// RFC 3339 creation time.
    pub(crate) created_at: String,
    /// RFC 3339 expiry.
    pub(crate) expires_at: String,
    /// CPUs (requests = limits).
    pub(crate) cpus: f64,
    /// Memory in MiB (requests = limits).
    pub(crate) memory_mib: u64,
    /// Disk in MiB (the claim's size, or the ephemeral-storage limit).
    pub(crate) disk_mib: u64,
}

/// The object name of a sandbox's anchor, NetworkPolicy and pod.
pub(crate) fn name(id: &str) -> String {
    format!("sbx-{id}")
}

/// The workspace claim's name.
pub(crate) fn claim(id: &str) -> String {
    format!("ws-{id}")
}

fn metadata(sbx: &Sandbox, target: &Target, owner_uid: Option<&str>, name: &str) -> Value {
    let mut m = json!({
        "name": name,
        "namespace": target.namespace,
        "labels": {
            "app.kubernetes.io/managed-by": MANAGED_BY,
            "app.kubernetes.io/name": "sandgate-sandbox",
            SANDBOX_ID: sbx.id,
        },
        "annotations": {
            CREATED_AT: sbx.created_at,
            EXPIRES_AT: sbx.expires_at,
            PROFILE: sbx.profile,
        },
    });
    if let Some(uid) = owner_uid {
        m["ownerReferences"] = json!([{
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": self::name(&sbx.id),
            "uid": uid,
            "blockOwnerDeletion": true,
        }]);
    }
    m
}

/// The anchor: a ConfigMap that owns every other object of the sandbox (deleting it deletes
/// them), carrying the metadata the reaper and resume read.
pub(crate) fn anchor(sbx: &Sandbox, target: &Target) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(sbx, target, None, &name(&sbx.id)),
        "data": {
            "sandbox-id": sbx.id,
            "created-at": sbx.created_at,
            "expires-at": sbx.expires_at,
            "profile": sbx.profile,
            "cpus": sbx.cpus.to_string(),
            "memory-mib": sbx.memory_mib.to_string(),
            "disk-mib": sbx.disk_mib.to_string(),
        },
    })
}

/// Egress only to the proxy pods on the proxy port; no ingress at all.
pub(crate) fn network_policy(sbx: &Sandbox, target: &Target, owner_uid: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(sbx, target, Some(owner_uid), &name(&sbx.id)),
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX_ID: sbx.id}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [{
                "to": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": target.proxy_namespace}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": target.proxy_app}},
                }],
                "ports": [{"protocol": "TCP", "port": target.proxy_port()}],
            }],
        },
    })
}

/// The workspace claim (owned by the anchor, never by the pod, so pausing keeps it).
pub(crate) fn workspace_claim(sbx: &Sandbox, target: &Target, owner_uid: &str, storage_class: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(sbx, target, Some(owner_uid), &claim(&sbx.id)),
        "spec": {
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": format!("{}Mi", sbx.disk_mib)}},
        },
    })
}

/// The sandbox pod, with `remaining` seconds to live.
pub(crate) fn pod(sbx: &Sandbox, target: &Target, owner_uid: &str, remaining: u64) -> Value {
    let proxy_url = format!("http://{}:{}@{}", name(&sbx.id), sbx.token, target.proxy);
    let ca = sandgate_sidecar::webhook::CA_PATH;
    let mut env = vec![];
    for var in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        env.push(json!({"name": var, "value": proxy_url}));
    }
    env.push(json!({"name": "NO_PROXY", "value": "localhost,127.0.0.1"}));
    env.push(json!({"name": "no_proxy", "value": "localhost,127.0.0.1"}));
    for var in sandgate_sidecar::webhook::TRUST_VARS {
        env.push(json!({"name": var, "value": ca}));
    }
    let cpu = format_cpus(sbx.cpus);
    let memory = format!("{}Mi", sbx.memory_mib);
    let mut limits = json!({"cpu": cpu, "memory": memory});
    let workspace = match &target.storage_class {
        Some(_) => json!({"name": "workspace", "persistentVolumeClaim": {"claimName": claim(&sbx.id)}}),
        None => {
            // No claim: the disk limit is the pod's ephemeral storage.
            limits["ephemeral-storage"] = json!(format!("{}Mi", sbx.disk_mib));
            json!({"name": "workspace", "emptyDir": {"sizeLimit": format!("{}Mi", sbx.disk_mib)}})
        }
    };
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 10,
        "activeDeadlineSeconds": remaining.max(1),
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "workspace",
            "image": target.image,
            "command": ["sleep", "infinity"],
            "workingDir": "/workspace",
            "env": env,
            "resources": {"requests": limits.clone(), "limits": limits},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": "workspace", "mountPath": "/workspace"},
                {"name": "sandgate-ca", "mountPath": "/etc/sandgate/ca", "readOnly": true},
            ],
        }],
        "volumes": [workspace, {"name": "sandgate-ca", "configMap": {"name": target.ca_configmap}}],
    });
    if let Some(rc) = &target.runtime_class {
        spec["runtimeClassName"] = json!(rc);
    }
    let mut meta = metadata(sbx, target, Some(owner_uid), &name(&sbx.id));
    meta["annotations"][TOKEN_SHA256] = json!(token_sha256(&sbx.token));
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// SHA-256 of a token, lowercase hex.
pub(crate) fn token_sha256(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// CPUs as a Kubernetes quantity: whole numbers as is, fractions in millicores.
fn format_cpus(cpus: f64) -> String {
    if cpus.fract() == 0.0 { format!("{cpus:.0}") } else { format!("{:.0}m", cpus * 1000.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn target() -> Target {
        Target {
            namespace: "sandboxes".into(),
            runtime_class: Some("gvisor".into()),
            storage_class: Some("standard".into()),
            image: "ghcr.io/example/workspace:1".into(),
            proxy: "10.96.0.40:4750".into(),
            proxy_namespace: "sandgate-system".into(),
            proxy_app: "sandgate-agent".into(),
            ca_configmap: "sandgate-ca".into(),
        }
    }

    #[test]
    fn the_pod_is_locked_down() {
        let sbx = Sandbox {
            id: "a1b2c3".into(),
            token: "t0k3n".into(),
            profile: "default".into(),
            created_at: "2026-11-29T16:00:00Z".into(),
            expires_at: "2026-11-29T22:00:00Z".into(),
            cpus: 0.5,
            memory_mib: 2048,
            disk_mib: 10240,
        };
        let p = pod(&sbx, &target(), "uid-1", 3600);
        assert_eq!(p["spec"]["automountServiceAccountToken"], false);
        assert_eq!(p["spec"]["enableServiceLinks"], false);
        assert_eq!(p["spec"]["activeDeadlineSeconds"], 3600);
        assert_eq!(p["spec"]["runtimeClassName"], "gvisor");
        assert_eq!(p["spec"]["containers"][0]["resources"]["limits"]["cpu"], "500m");
        assert_eq!(p["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(p["metadata"]["annotations"][TOKEN_SHA256], token_sha256("t0k3n"));
        assert!(p.to_string().contains("http://sbx-a1b2c3:t0k3n@10.96.0.40:4750"));
    }
}
