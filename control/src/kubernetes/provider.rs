//! The Kubernetes provider: creates, pauses, resumes and destroys sandboxes in one namespace of
//! a user's cluster, reaps what is expired or orphaned (by label, so it finds objects made by a
//! control process that has since died), and tests a connection before it is saved.
//!
//! Creation order is the security order: the anchor, then the NetworkPolicy (so the pod never
//! exists without it), then the workspace claim, then the pod.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};

use super::manifests::{self, CREATED_AT, EXPIRES_AT, MANAGED_SELECTOR, SANDBOX_ID, Sandbox, Target};

/// Why a Kubernetes operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    /// The kubeconfig is unusable.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The kubeconfig runs a program to get credentials, which was not allowed.
    #[error(
        "kubeconfig: user `{0}` gets its credentials by running a program (`exec`), which would run on this \
         host; use a ServiceAccount-token kubeconfig, or pass --allow-exec if you trust that program"
    )]
    ExecPlugin(String),
    /// The API server refused or failed a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        source: kube::Error,
    },
    /// No such sandbox.
    #[error("no sandbox {0} in the namespace")]
    NoSandbox(String),
    /// The sandbox is not in a state that allows the operation.
    #[error("sandbox {id}: {why}")]
    State {
        /// The sandbox.
        id: String,
        /// Why not.
        why: String,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
    let what = what.into();
    move |source| KubeError::Api { what, source }
}

/// A client from a kubeconfig held in memory (it was sealed in the vault). Kubeconfigs with
/// `exec` credential plugins are refused unless `allow_exec`.
pub(crate) async fn client(kubeconfig: &str, allow_exec: bool) -> Result<Client, KubeError> {
    let kc = Kubeconfig::from_yaml(kubeconfig).map_err(|e| KubeError::Kubeconfig(e.to_string()))?;
    if !allow_exec {
        for user in &kc.auth_infos {
            if user.auth_info.as_ref().is_some_and(|a| a.exec.is_some() || a.auth_provider.is_some()) {
                return Err(KubeError::ExecPlugin(user.name.clone()));
            }
        }
    }
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| KubeError::Kubeconfig(e.to_string()))?;
    Client::try_from(config).map_err(|e| KubeError::Kubeconfig(e.to_string()))
}

/// The provider for one namespace of one cluster.
pub(crate) struct Provider {
    client: Client,
    target: Target,
}

/// A sandbox as the cluster describes it.
#[derive(Debug)]
pub(crate) struct Listed {
    /// Its id.
    pub(crate) id: String,
    /// `running`, `paused` (no pod), or the pod's phase.
    pub(crate) state: String,
    /// RFC 3339 expiry.
    pub(crate) expires_at: String,
}

impl Provider {
    /// A provider over `client` for `target`.
    pub(crate) fn new(client: Client, target: Target) -> Self {
        Self { client, target }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.target.namespace)
    }

    /// Creates a sandbox: anchor, NetworkPolicy, claim (with a storage class), pod.
    pub(crate) async fn create(&self, sbx: &Sandbox, lifetime: Duration) -> Result<(), KubeError> {
        let mut pod = manifests::pod(sbx, &self.target, "", lifetime.as_secs());
        self.create_with(sbx, lifetime, &mut pod).await
    }

    /// The anchor's record of a sandbox.
    async fn anchor(&self, id: &str) -> Result<ConfigMap, KubeError> {
        let name = manifests::name(id);
        self.api::<ConfigMap>()
            .get_opt(&name)
            .await
            .map_err(api_err(format!("read anchor {name}")))?
            .ok_or_else(|| KubeError::NoSandbox(id.to_owned()))
    }

    /// Pauses: deletes the pod and waits until it is gone; the claim, policy and anchor stay.
    pub(crate) async fn pause(&self, id: &str) -> Result<(), KubeError> {
        self.anchor(id).await?;
        let name = manifests::name(id);
        let pods = self.api::<Pod>();
        if pods.get_opt(&name).await.map_err(api_err(format!("read pod {name}")))?.is_none() {
            return Err(KubeError::State { id: id.to_owned(), why: "already paused".into() });
        }
        pods.delete(&name, &DeleteParams::default()).await.map_err(api_err(format!("delete pod {name}")))?;
        // A new pod on the same claim can only attach once the old one is gone (RWO).
        for _ in 0..120 {
            if pods.get_opt(&name).await.map_err(api_err(format!("read pod {name}")))?.is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(KubeError::State { id: id.to_owned(), why: "its pod is still terminating after 60s".into() })
    }

    /// Resumes: recreates the pod on the same claim with the lifetime that remains.
    pub(crate) async fn resume(&self, id: &str, token: &str, now: i64) -> Result<(), KubeError> {
        let anchor = self.anchor(id).await?;
        let name = manifests::name(id);
        if self.api::<Pod>().get_opt(&name).await.map_err(api_err(format!("read pod {name}")))?.is_some() {
            return Err(KubeError::State { id: id.to_owned(), why: "is running, not paused".into() });
        }
        let data = anchor.data.unwrap_or_default();
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        let expires = parse_time(&get("expires-at")).unwrap_or(now);
        if expires <= now {
            return Err(KubeError::State {
                id: id.to_owned(),
                why: "its lifetime is over; the reaper removes it".into(),
            });
        }
        let sbx = Sandbox {
            id: id.to_owned(),
            token: token.to_owned(),
            profile: get("profile"),
            created_at: get("created-at"),
            expires_at: get("expires-at"),
            cpus: get("cpus").parse().unwrap_or(2.0),
            memory_mib: get("memory-mib").parse().unwrap_or(2048),
            disk_mib: get("disk-mib").parse().unwrap_or(10240),
        };
        let uid = anchor
            .metadata
            .uid
            .ok_or_else(|| KubeError::State { id: id.to_owned(), why: "its anchor has no uid".into() })?;
        let remaining = u64::try_from(expires - now).unwrap_or(1);
        let pod: Pod = typed(manifests::pod(&sbx, &self.target, &uid, remaining))?;
        self.api::<Pod>().create(&PostParams::default(), &pod).await.map_err(api_err(format!("create pod {name}")))?;
        Ok(())
    }

    /// Destroys: deletes the anchor; the cluster's garbage collector deletes what it owns.
    pub(crate) async fn destroy(&self, id: &str) -> Result<(), KubeError> {
        let name = manifests::name(id);
        match self.api::<ConfigMap>().delete(&name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(KubeError::NoSandbox(id.to_owned())),
            Err(e) => Err(api_err(format!("delete anchor {name}"))(e)),
        }
    }

    /// Every sandbox in the namespace, from the anchors and pods.
    pub(crate) async fn list(&self) -> Result<Vec<Listed>, KubeError> {
        let lp = ListParams::default().labels(MANAGED_SELECTOR);
        let anchors = self.api::<ConfigMap>().list(&lp).await.map_err(api_err("list anchors"))?;
        let pods = self.api::<Pod>().list(&lp).await.map_err(api_err("list pods"))?;
        let mut out = Vec::new();
        for a in anchors.items {
            let Some(id) = label(&a.metadata, SANDBOX_ID) else { continue };
            let pod = pods.items.iter().find(|p| label(&p.metadata, SANDBOX_ID).as_deref() == Some(id.as_str()));
            let state = match pod.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.clone()) {
                _ if pod.is_none() => "paused".to_owned(),
                Some(phase) if phase == "Running" => "running".to_owned(),
                Some(phase) => phase.to_lowercase(),
                None => "pending".to_owned(),
            };
            let expires_at = annotation(&a.metadata, EXPIRES_AT).unwrap_or_default();
            out.push(Listed { id, state, expires_at });
        }
        Ok(out)
    }

    /// Deletes expired sandboxes (anchors past `expires-at`, paused ones included) and orphans
    /// (pods, claims and policies whose anchor is gone). Returns what was deleted, as
    /// `kind/name (why)`.
    pub(crate) async fn reap(&self, now: i64) -> Result<Vec<String>, KubeError> {
        let lp = ListParams::default().labels(MANAGED_SELECTOR);
        let mut removed = Vec::new();
        let mut live = Vec::new();
        for a in self.api::<ConfigMap>().list(&lp).await.map_err(api_err("list anchors"))?.items {
            let Some(id) = label(&a.metadata, SANDBOX_ID) else { continue };
            let expires = annotation(&a.metadata, EXPIRES_AT).and_then(|t| parse_time(&t));
            let created = annotation(&a.metadata, CREATED_AT).and_then(|t| parse_time(&t));
            // An anchor without readable times is treated as expired: nothing can prove it is not.
            if expires.is_none_or(|e| e <= now) || created.is_none() {
                let name = manifests::name(&id);
                self.api::<ConfigMap>()
                    .delete(&name, &DeleteParams::background())
                    .await
                    .map_err(api_err(format!("delete anchor {name}")))?;
                removed.push(format!("configmap/{name} (expired)"));
            } else {
                live.push(id);
            }
        }
        let orphan = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            label(m, SANDBOX_ID).is_none_or(|id| !live.contains(&id))
        };
        for p in self.api::<Pod>().list(&lp).await.map_err(api_err("list pods"))?.items {
            if orphan(&p.metadata) {
                let name = p.metadata.name.unwrap_or_default();
                delete_orphan(&self.api::<Pod>(), &name, &mut removed, "pod").await?;
            }
        }
        for c in self.api::<PersistentVolumeClaim>().list(&lp).await.map_err(api_err("list claims"))?.items {
            if orphan(&c.metadata) {
                let name = c.metadata.name.unwrap_or_default();
                delete_orphan(&self.api::<PersistentVolumeClaim>(), &name, &mut removed, "persistentvolumeclaim")
                    .await?;
            }
        }
        for n in self.api::<NetworkPolicy>().list(&lp).await.map_err(api_err("list NetworkPolicies"))?.items {
            if orphan(&n.metadata) {
                let name = n.metadata.name.unwrap_or_default();
                delete_orphan(&self.api::<NetworkPolicy>(), &name, &mut removed, "networkpolicy").await?;
            }
        }
        Ok(removed)
    }

    /// The deep check: a short-lived probe sandbox, made exactly as a real one (anchor,
    /// NetworkPolicy, pod), whose only command tries an outside address directly and then the
    /// proxy. The only way to learn that a CNI ignores NetworkPolicy. The probe is removed
    /// whatever happens.
    pub(crate) async fn deep_check(&self, sbx: &Sandbox, image: &str) -> Check {
        const WAIT: Duration = Duration::from_secs(120);
        let what = "a probe sandbox: direct egress blocked, the proxy reachable";
        let mut target = self.target.clone();
        target.image = image.to_owned();
        target.storage_class = None;
        let probe = Provider { client: self.client.clone(), target };
        let mut pod = probe.pod_with_command(sbx, PROBE_SCRIPT);
        if let Err(e) = probe.create_with(sbx, WAIT, &mut pod).await {
            return Check::new(what, false, format!("could not create it: {e}"));
        }
        let name = manifests::name(&sbx.id);
        let deadline = tokio::time::Instant::now() + WAIT;
        let code = loop {
            let state =
                self.api::<Pod>().get_opt(&name).await.ok().flatten().and_then(|p| p.status).and_then(|s| {
                    s.container_statuses?.first()?.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
                });
            if let Some(code) = state {
                break Some(code);
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let _ = self.destroy(&sbx.id).await;
        match code {
            Some(0) => Check::new(what, true, String::new()),
            Some(10) => Check::new(
                what,
                false,
                "the probe reached an outside address directly: this cluster's CNI does not enforce NetworkPolicy, \
                 so sandboxes are not confined (use a CNI that does: Calico, Cilium, ...)"
                    .into(),
            ),
            Some(11) => {
                Check::new(what, false, format!("the probe could not reach the proxy at {}", self.target.proxy))
            }
            Some(other) => {
                Check::new(what, false, format!("the probe failed (exit {other}); does its image have curl?"))
            }
            None => Check::new(what, false, "the probe did not finish within 120 s (image pull? scheduling?)".into()),
        }
    }

    /// A sandbox pod whose container runs `script` instead of idling.
    fn pod_with_command(&self, sbx: &Sandbox, script: &str) -> Value {
        let mut pod = manifests::pod(sbx, &self.target, "", 120);
        pod["spec"]["containers"][0]["command"] = json!(["sh", "-c", script]);
        pod
    }

    /// Creates a sandbox around `pod` (its owner is filled in here): anchor, NetworkPolicy,
    /// claim (with a storage class), pod. A failure removes what was made.
    async fn create_with(&self, sbx: &Sandbox, lifetime: Duration, pod: &mut Value) -> Result<(), KubeError> {
        let name = manifests::name(&sbx.id);
        let pp = PostParams::default();
        let anchor: ConfigMap = typed(manifests::anchor(sbx, &self.target))?;
        let anchor =
            self.api::<ConfigMap>().create(&pp, &anchor).await.map_err(api_err(format!("create anchor {name}")))?;
        let made = async {
            let uid = anchor.metadata.uid.ok_or_else(|| KubeError::State {
                id: sbx.id.clone(),
                why: "the API server returned its anchor without a uid".into(),
            })?;
            let np: NetworkPolicy = typed(manifests::network_policy(sbx, &self.target, &uid))?;
            self.api::<NetworkPolicy>()
                .create(&pp, &np)
                .await
                .map_err(api_err(format!("create NetworkPolicy {name}")))?;
            if let Some(sc) = &self.target.storage_class {
                let pvc: PersistentVolumeClaim = typed(manifests::workspace_claim(sbx, &self.target, &uid, sc))?;
                self.api::<PersistentVolumeClaim>()
                    .create(&pp, &pvc)
                    .await
                    .map_err(api_err(format!("create claim {}", manifests::claim(&sbx.id))))?;
            }
            pod["metadata"]["ownerReferences"][0]["uid"] = json!(uid);
            pod["spec"]["activeDeadlineSeconds"] = json!(lifetime.as_secs().max(1));
            let pod: Pod = typed(pod.clone())?;
            self.api::<Pod>().create(&pp, &pod).await.map_err(api_err(format!("create pod {name}")))?;
            Ok::<(), KubeError>(())
        }
        .await;
        if made.is_err() {
            // Nothing half-made is left behind: the anchor takes the rest with it.
            let _ = self.api::<ConfigMap>().delete(&name, &DeleteParams::background()).await;
        }
        made
    }

    /// Checks everything the provider needs, reporting each failure by name: the API version,
    /// the namespace, each verb on each resource (SelfSubjectAccessReview), the runtime class
    /// and the storage class.
    pub(crate) async fn test_connection(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        match self.client.apiserver_version().await {
            Ok(v) => {
                let minor: u32 = v.minor.trim_end_matches('+').parse().unwrap_or(0);
                let ok = v.major == "1" && minor >= 29;
                let why = if ok { String::new() } else { "Sandgate needs Kubernetes 1.29 or newer".to_owned() };
                checks.push(Check::new(format!("API server version {}", v.git_version), ok, why));
            }
            Err(e) => checks.push(Check::new("API server reachable", false, e.to_string())),
        }
        let ns: Api<Namespace> = Api::all(self.client.clone());
        checks.push(exists(ns.get_opt(&self.target.namespace).await, format!("namespace {}", self.target.namespace)));
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        for (group, resource, verbs) in NEEDED {
            for verb in *verbs {
                let review: Result<SelfSubjectAccessReview, _> = serde_json::from_value(json!({
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": {
                        "namespace": self.target.namespace, "group": group, "resource": resource, "verb": verb,
                    }},
                }));
                let what = format!("may {verb} {resource}");
                let answer = match review {
                    Ok(r) => reviews.create(&PostParams::default(), &r).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                checks.push(match answer {
                    Ok(r) => {
                        let status = r.status.unwrap_or_default();
                        let why = status.reason.unwrap_or_else(|| "denied by the cluster's RBAC".into());
                        Check::new(what, status.allowed, if status.allowed { String::new() } else { why })
                    }
                    Err(e) => Check::new(what, false, e),
                });
            }
        }
        if let Some(rc) = &self.target.runtime_class {
            let api: Api<RuntimeClass> = Api::all(self.client.clone());
            checks.push(exists(api.get_opt(rc).await, format!("runtime class {rc}")));
        }
        if let Some(sc) = &self.target.storage_class {
            let api: Api<StorageClass> = Api::all(self.client.clone());
            checks.push(exists(api.get_opt(sc).await, format!("storage class {sc}")));
        }
        checks
    }
}

/// The deep check's probe: exit 10 when an outside address answers directly (NetworkPolicy not
/// enforced), 11 when the proxy (from `HTTP_PROXY`) does not answer, 0 otherwise. Any HTTP
/// status from the proxy (even a denial) proves it is reachable.
const PROBE_SCRIPT: &str = "\
code=$(curl -s -o /dev/null -m 5 --noproxy '*' -w '%{http_code}' http://1.1.1.1/ 2>/dev/null); \
[ \"${code:-000}\" != 000 ] && exit 10; \
code=$(curl -s -o /dev/null -m 10 -w '%{http_code}' http://sandgate-probe.invalid/ 2>/dev/null); \
[ \"${code:-000}\" = 000 ] && exit 11; \
exit 0";

/// The verbs the provider uses, per resource (the Role in deploy/ grants exactly these).
pub(crate) const NEEDED: &[(&str, &str, &[&str])] = &[
    ("", "configmaps", &["create", "get", "list", "delete"]),
    ("", "pods", &["create", "get", "list", "delete"]),
    ("", "persistentvolumeclaims", &["create", "list", "delete"]),
    ("networking.k8s.io", "networkpolicies", &["create", "list", "delete"]),
];

/// One line of "Test connection".
#[derive(Debug)]
pub(crate) struct Check {
    /// What was checked.
    pub(crate) what: String,
    /// Whether it passed.
    pub(crate) ok: bool,
    /// Why it failed.
    pub(crate) why: String,
}

impl Check {
    fn new(what: impl Into<String>, ok: bool, why: String) -> Self {
        Self { what: what.into(), ok, why }
    }
}

fn exists<K>(got: Result<Option<K>, kube::Error>, what: String) -> Check {
    match got {
        Ok(Some(_)) => Check::new(what, true, String::new()),
        Ok(None) => Check::new(what, false, "not found".into()),
        Err(e) => Check::new(what, false, e.to_string()),
    }
}

async fn delete_orphan<K>(api: &Api<K>, name: &str, removed: &mut Vec<String>, kind: &str) -> Result<(), KubeError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        // Already gone (the garbage collector was faster): nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(api_err(format!("delete {kind} {name}"))(e)),
    }
    removed.push(format!("{kind}/{name} (orphaned)"));
    Ok(())
}

fn label(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    m.labels.as_ref().and_then(|l| l.get(key)).cloned()
}

fn annotation(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<String> {
    m.annotations.as_ref().and_then(|l| l.get(key)).cloned()
}

/// A manifest as the client's type (a failure here is a bug in `manifests`).
fn typed<K: serde::de::DeserializeOwned>(v: Value) -> Result<K, KubeError> {
    serde_json::from_value(v)
        .map_err(|e| KubeError::Kubeconfig(format!("internal: manifest does not fit its type: {e}")))
}

/// Unix seconds as RFC 3339 (UTC).
pub(crate) fn format_time(unix: i64) -> String {
    jiff::Timestamp::from_second(unix).map(|t| t.to_string()).unwrap_or_default()
}

/// RFC 3339 as Unix seconds.
pub(crate) fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}
