//! A stand-in for the Kubernetes API server (none can run here): HTTPS on 127.0.0.1:0, the
//! few endpoints the provider and the node agent use, answered in the API server's shapes
//! (objects with uid and resourceVersion, `...List` kinds, `Status` errors, garbage collection
//! of owned objects when their owner is deleted, watch events as JSON lines). Every request is
//! recorded, bodies included, so tests can assert the order and validate each body against
//! the Kubernetes schemas.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use super::pki::Pki;

/// The bearer token the fake accepts.
pub(crate) const TOKEN: &str = "fake-sa-token";

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// `GET`, `POST`, `DELETE`.
    pub(crate) method: String,
    /// The path, without the query.
    pub(crate) path: String,
    /// The query string.
    pub(crate) query: String,
    /// The JSON body, for POSTs.
    pub(crate) body: Option<Value>,
}

/// What the fake cluster holds and allows.
#[derive(Default)]
pub(crate) struct Cluster {
    /// Objects by collection path (`/api/v1/namespaces/ns/pods`).
    pub(crate) objects: BTreeMap<String, Vec<Value>>,
    /// `(verb, resource)` pairs SelfSubjectAccessReview denies.
    pub(crate) denied: Vec<(String, String)>,
    /// Cluster-scoped objects that exist: `runtimeclasses/gvisor`, `namespaces/x`, ...
    pub(crate) cluster_objects: Vec<String>,
    /// Watch events: resource version, collection, `ADDED`/`DELETED`, object.
    events: Vec<(u64, String, &'static str, Value)>,
    next: u64,
}

/// A running fake API server.
pub(crate) struct FakeApi {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Every request, in order.
    pub(crate) requests: Arc<Mutex<Vec<Recorded>>>,
    /// Its state (tests may plant objects, e.g. left by a control process that died).
    pub(crate) cluster: Arc<Mutex<Cluster>>,
    /// Its CA, for the kubeconfig.
    pub(crate) pki: Pki,
    /// Requests before this index are left out of [`FakeApi::calls`].
    mark: std::sync::atomic::AtomicUsize,
    /// Wakes watches when the cluster changes.
    changed: Arc<tokio::sync::Notify>,
}

impl FakeApi {
    /// Starts on the current tokio runtime.
    pub(crate) async fn start() -> Self {
        let pki = Pki::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config(&["127.0.0.1"]));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let cluster = Arc::new(Mutex::new(Cluster::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let (r, c, n) = (requests.clone(), cluster.clone(), changed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (r, c, n, acceptor) = (r.clone(), c.clone(), n.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(req, r.clone(), c.clone(), n.clone()));
                    super::origin::serve_http1(stream, Some(acceptor), service).await;
                });
            }
        });
        Self { addr, requests, cluster, pki, mark: 0.into(), changed }
    }

    /// A kubeconfig for this server with a ServiceAccount-style token.
    pub(crate) fn kubeconfig(&self, namespace: &str) -> String {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&self.pki.ca_path).unwrap());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://{}\n    \
             certificate-authority-data: {ca}\nusers:\n- name: sandgate\n  user:\n    token: {TOKEN}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sandgate\n    namespace: {namespace}\n\
             current-context: fake\n",
            self.addr
        )
    }

    /// Writes [`FakeApi::kubeconfig`] to `dir/kubeconfig` and returns its path.
    pub(crate) fn kubeconfig_file(&self, dir: &std::path::Path, namespace: &str) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(&path, self.kubeconfig(namespace)).unwrap();
        path
    }

    /// Makes cluster-scoped objects exist (`namespaces/sandboxes`, `runtimeclasses/gvisor`, ...).
    pub(crate) fn add_cluster_objects(&self, names: &[&str]) {
        self.cluster.lock().unwrap().cluster_objects.extend(names.iter().map(|s| (*s).to_owned()));
    }

    /// The requests since the last [`FakeApi::clear`], as `METHOD path` lines (no queries).
    pub(crate) fn calls(&self) -> Vec<String> {
        let from = self.mark.load(std::sync::atomic::Ordering::Relaxed);
        self.requests.lock().unwrap()[from..].iter().map(|r| format!("{} {}", r.method, r.path)).collect()
    }

    /// Starts [`FakeApi::calls`] afresh (`requests` keeps everything).
    pub(crate) fn clear(&self) {
        self.mark.store(self.requests.lock().unwrap().len(), std::sync::atomic::Ordering::Relaxed);
    }

    /// The objects in a collection.
    pub(crate) fn objects(&self, collection: &str) -> Vec<Value> {
        self.cluster.lock().unwrap().objects.get(collection).cloned().unwrap_or_default()
    }

    /// Stores an object as if created through the API (uid assigned, watchers told); returns it.
    pub(crate) fn plant(&self, collection: &str, object: Value) -> Value {
        let mut c = self.cluster.lock().unwrap();
        let o = c.insert(collection, object);
        self.changed.notify_waiters();
        o
    }

    /// Deletes an object as if through the API (watchers told).
    pub(crate) fn remove(&self, collection: &str, name: &str) {
        let mut c = self.cluster.lock().unwrap();
        let uid = c
            .objects
            .get(collection)
            .and_then(|l| l.iter().find(|o| o["metadata"]["name"] == name))
            .map(|o| o["metadata"]["uid"].clone());
        if let Some(uid) = uid {
            c.collect(uid.as_str().unwrap_or(""));
        }
        self.changed.notify_waiters();
    }
}

impl Cluster {
    fn admit(&mut self, mut o: Value) -> Value {
        self.next += 1;
        o["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012}", self.next));
        o["metadata"]["resourceVersion"] = json!(self.next.to_string());
        o["metadata"]["creationTimestamp"] = json!("2026-11-29T16:00:00Z");
        // Pods are scheduled to node-1 and run at once on 127.0.0.1, unless the test planted
        // another node or status.
        if o["kind"] == "Pod" && o.get("status").is_none() {
            o["status"] = json!({"phase": "Running", "podIP": "127.0.0.1"});
        }
        if o["kind"] == "Pod" && o["spec"].get("nodeName").is_none() {
            o["spec"]["nodeName"] = json!("node-1");
        }
        o
    }

    /// Admits `o` into `collection` and records the watch event; returns it as stored.
    fn insert(&mut self, collection: &str, o: Value) -> Value {
        let o = self.admit(o);
        self.objects.entry(collection.to_owned()).or_default().push(o.clone());
        self.events.push((self.next, collection.to_owned(), "ADDED", o.clone()));
        o
    }

    /// Deletes `uid` and, like the garbage collector, everything it owns (transitively).
    fn collect(&mut self, uid: &str) {
        let mut gone = Vec::new();
        for (collection, list) in &mut self.objects {
            list.retain(|o| {
                let owners = o["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
                let owned = owners.iter().any(|r| r["uid"] == uid);
                if owned || o["metadata"]["uid"] == uid {
                    gone.push((collection.clone(), o.clone(), owned));
                    return false;
                }
                true
            });
        }
        for (collection, mut o, owned) in gone {
            self.next += 1;
            o["metadata"]["resourceVersion"] = json!(self.next.to_string());
            self.events.push((self.next, collection, "DELETED", o.clone()));
            if owned {
                self.collect(o["metadata"]["uid"].as_str().unwrap_or(""));
            }
        }
    }
}

fn status(code: u16, reason: &str, message: String) -> (StatusCode, Value) {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" }, "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), body)
}

fn selected(o: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| match term.split_once('=') {
        Some((k, v)) => o["metadata"]["labels"][k] == v,
        None => o["metadata"]["labels"].get(term).is_some(),
    })
}

/// `fieldSelector` terms such as `spec.nodeName=node-1`.
fn fields_match(o: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| match term.split_once('=') {
        Some((k, v)) => o.pointer(&format!("/{}", k.replace('.', "/"))) == Some(&json!(v)),
        None => false,
    })
}

/// All pods, any namespace, matching the query's selectors.
fn pods_matching<'a>(c: &'a Cluster, query: &str) -> impl Iterator<Item = &'a Value> {
    let labels = query_param(query, "labelSelector").unwrap_or_default();
    let fields = query_param(query, "fieldSelector").unwrap_or_default();
    c.objects
        .iter()
        .filter(|(k, _)| k.ends_with("/pods"))
        .flat_map(|(_, v)| v.iter())
        .filter(move |o| selected(o, &labels) && fields_match(o, &fields))
}

/// A watch on all pods: waits (up to 5 s) for events after `resourceVersion`, returns them as
/// JSON lines and ends the stream, as an API server may at any time.
async fn watch_pods(query: &str, cluster: &Mutex<Cluster>, changed: &tokio::sync::Notify) -> Value {
    let since: u64 = query_param(query, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let labels = query_param(query, "labelSelector").unwrap_or_default();
    let fields = query_param(query, "fieldSelector").unwrap_or_default();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let notified = changed.notified();
        let lines: Vec<String> = {
            let c = cluster.lock().unwrap();
            c.events
                .iter()
                .filter(|(rv, coll, _, o)| {
                    *rv > since && coll.ends_with("/pods") && selected(o, &labels) && fields_match(o, &fields)
                })
                .map(|(_, _, kind, o)| json!({"type": kind, "object": o}).to_string())
                .collect()
        };
        if !lines.is_empty() {
            return Value::String(lines.join("\n") + "\n");
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Value::String(String::new());
        }
    }
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.replace("%3D", "=").replace("%2C", ",").replace("%2F", "/"))
    })
}

async fn handle(
    req: Request<Incoming>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    cluster: Arc<Mutex<Cluster>>,
    changed: Arc<tokio::sync::Notify>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let authorized =
        req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"));
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    requests.lock().unwrap().push(Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body: body.clone(),
    });
    let (code, answer) = if !authorized {
        status(401, "Unauthorized", "Unauthorized".into())
    } else if path == "/api/v1/pods" && query.contains("watch=true") {
        (StatusCode::OK, watch_pods(&query, &cluster, &changed).await)
    } else if path == "/api/v1/pods" {
        let c = cluster.lock().unwrap();
        let items: Vec<Value> = pods_matching(&c, &query).cloned().collect();
        (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": c.next.to_string()}, "items": items}),
        )
    } else {
        let answer = route(&method, &path, &query, body, &mut cluster.lock().unwrap());
        changed.notify_waiters();
        answer
    };
    let text = match answer {
        Value::String(lines) => lines,
        other => other.to_string(),
    };
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = code;
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    Ok(r)
}

fn route(method: &str, path: &str, query: &str, body: Option<Value>, c: &mut Cluster) -> (StatusCode, Value) {
    if path == "/version" {
        return (
            StatusCode::OK,
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.4", "gitCommit": "fake",
            "gitTreeState": "clean", "buildDate": "2026-08-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
            "platform": "linux/amd64"}),
        );
    }
    if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" && method == "POST" {
        let mut review = body.unwrap_or_default();
        let attrs = &review["spec"]["resourceAttributes"];
        let key =
            (attrs["verb"].as_str().unwrap_or("").to_owned(), attrs["resource"].as_str().unwrap_or("").to_owned());
        let allowed = !c.denied.contains(&key);
        review["status"] = if allowed {
            json!({"allowed": true})
        } else {
            json!({"allowed": false, "reason": "no RBAC rule allows it"})
        };
        return (StatusCode::CREATED, review);
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // Namespaced: api/v1/namespaces/NS/RES[/NAME] or apis/G/V/namespaces/NS/RES[/NAME].
    let ns_at = parts.iter().position(|p| *p == "namespaces");
    let (collection, name) = match ns_at {
        Some(i) if parts.len() >= i + 3 => (format!("/{}", parts[..i + 3].join("/")), parts.get(i + 3).copied()),
        _ => {
            // Cluster-scoped GET: namespaces/NAME, runtimeclasses/NAME, storageclasses/NAME.
            let key = parts[parts.len().saturating_sub(2)..].join("/");
            return if method == "GET" && c.cluster_objects.contains(&key) {
                let kind = match parts[parts.len() - 2] {
                    "namespaces" => ("v1", "Namespace"),
                    "runtimeclasses" => ("node.k8s.io/v1", "RuntimeClass"),
                    _ => ("storage.k8s.io/v1", "StorageClass"),
                };
                let mut o = json!({"apiVersion": kind.0, "kind": kind.1, "metadata": {"name": parts[parts.len() - 1]}});
                if kind.1 == "RuntimeClass" {
                    o["handler"] = json!("runsc");
                } else if kind.1 == "StorageClass" {
                    o["provisioner"] = json!("fake.csi.example");
                }
                (StatusCode::OK, o)
            } else {
                status(404, "NotFound", format!("{key} not found"))
            };
        }
    };
    let list = c.objects.entry(collection.clone()).or_default();
    match (method, name) {
        ("POST", None) => {
            let o = body.unwrap_or_default();
            let n = o["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if list.iter().any(|x| x["metadata"]["name"] == n.as_str()) {
                return status(409, "AlreadyExists", format!("{n} already exists"));
            }
            (StatusCode::CREATED, c.insert(&collection, o))
        }
        ("GET", None) => {
            let selector = query_param(query, "labelSelector").unwrap_or_default();
            let items: Vec<Value> = list.iter().filter(|o| selected(o, &selector)).cloned().collect();
            let kind = items.first().and_then(|o| o["kind"].as_str()).unwrap_or("Object").to_owned();
            let api = items.first().map(|o| o["apiVersion"].clone()).unwrap_or(json!("v1"));
            (
                StatusCode::OK,
                json!({"apiVersion": api, "kind": format!("{kind}List"), "metadata": {"resourceVersion": "1"}, "items": items}),
            )
        }
        ("GET", Some(n)) => match list.iter().find(|o| o["metadata"]["name"] == n) {
            Some(o) => (StatusCode::OK, o.clone()),
            None => status(404, "NotFound", format!("{n} not found")),
        },
        ("DELETE", Some(n)) => match list.iter().find(|o| o["metadata"]["name"] == n).cloned() {
            Some(o) => {
                c.collect(o["metadata"]["uid"].as_str().unwrap_or(""));
                status(200, "", format!("{n} deleted"))
            }
            None => status(404, "NotFound", format!("{n} not found")),
        },
        _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
    }
}
