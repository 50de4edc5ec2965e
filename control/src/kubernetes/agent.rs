//! The node agent's view of its node: a list-then-watch of Sandgate's sandbox pods scheduled
//! on this node (`spec.nodeName`), kept as the proxy's identity table: pod name, pod IP, token
//! hash and profile. A pod leaves the table when it is deleted or stops running, so a reused
//! IP never inherits an old sandbox's rights. On any watch error the agent lists again.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use sandgate_proxy::identity::{Identities, Identity, parse_sha256_hex};

use super::manifests::{MANAGED_SELECTOR, PROFILE, TOKEN_SHA256};

/// A client for the agent: from a kubeconfig file, or the in-cluster service account.
pub(crate) async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            // The agent's own kubeconfig is the operator's file: exec plugins are theirs to run.
            return super::provider::client(&text, true).await.map_err(|e| e.to_string());
        }
        None => kube::Config::incluster().map_err(|e| format!("not in a cluster and no --kubeconfig: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Keeps `ids` equal to the running sandbox pods on `node` (`*`: on every node), for ever.
pub(crate) async fn watch(client: kube::Client, node: String, ids: Arc<Identities>) {
    let pods: Api<Pod> = Api::all(client);
    // `*`: one proxy (a Deployment) for the sandbox pods of every node.
    let fields = if node == "*" { String::new() } else { format!("spec.nodeName={node}") };
    loop {
        let lp = ListParams::default().labels(MANAGED_SELECTOR).fields(&fields);
        let list = match pods.list(&lp).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%node, "cannot list sandbox pods (retrying in 2s): {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        };
        ids.replace_all(list.items.iter().filter_map(identity));
        tracing::info!(%node, sandboxes = ids.len(), "sandbox pods listed");
        let mut version = list.metadata.resource_version.unwrap_or_default();
        // Watch until the server ends the stream cleanly (watch again from where it stopped)
        // or something fails (list again).
        let wp = WatchParams::default().labels(MANAGED_SELECTOR).fields(&fields).timeout(290);
        while follow(&pods, &wp, &mut version, &ids).await {}
    }
}

/// Applies one watch's events to `ids`; `true` when the server ended it cleanly.
async fn follow(pods: &Api<Pod>, wp: &WatchParams, version: &mut String, ids: &Identities) -> bool {
    let stream = match pods.watch(wp, version).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("watch failed, listing again: {e}");
            return false;
        }
    };
    let mut stream = std::pin::pin!(stream);
    loop {
        match stream.try_next().await {
            Ok(Some(WatchEvent::Added(p) | WatchEvent::Modified(p))) => {
                remember(version, &p);
                apply(ids, &p);
            }
            Ok(Some(WatchEvent::Deleted(p))) => {
                remember(version, &p);
                if let Some(name) = &p.metadata.name {
                    ids.remove(name);
                    tracing::info!(pod = %name, "sandbox pod gone");
                }
            }
            Ok(Some(WatchEvent::Bookmark(b))) => *version = b.metadata.resource_version,
            Ok(Some(WatchEvent::Error(e))) => {
                tracing::info!("watch ended ({}), listing again", e.message);
                return false;
            }
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!("watch stream failed, listing again: {e}");
                return false;
            }
        }
    }
}

fn remember(version: &mut String, p: &Pod) {
    if let Some(v) = &p.metadata.resource_version {
        version.clone_from(v);
    }
}

/// Adds a pod that runs, or removes one that no longer does.
fn apply(ids: &Identities, p: &Pod) {
    let Some(name) = &p.metadata.name else { return };
    match identity(p) {
        Some(id) => {
            tracing::info!(pod = %name, addr = %id.addr, profile = %id.profile, "sandbox pod known");
            ids.insert(id);
        }
        None => ids.remove(name),
    }
}

/// The identity of a pod that is running (not terminating) with an IP and a token hash.
fn identity(p: &Pod) -> Option<Identity> {
    if p.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = p.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let addr = status.pod_ip.as_deref()?.parse().ok()?;
    let annotations = p.metadata.annotations.as_ref()?;
    let token_sha256 = parse_sha256_hex(annotations.get(TOKEN_SHA256)?)?;
    let profile = annotations.get(PROFILE).cloned().unwrap_or_else(|| "default".to_owned());
    Some(Identity { sandbox: p.metadata.name.clone()?, addr, token_sha256, profile })
}
