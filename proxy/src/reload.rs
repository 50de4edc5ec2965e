//! Policy loading and hot reload. A new policy is published only when it parses and compiles;
//! a broken file is logged and counted and the running policy stays. Live connections keep
//! the policy they started with. The file is polled (size, mtime, inode), which also catches
//! editors' rename-replace and Kubernetes ConfigMap symlink swaps that a watch on the file
//! itself would miss; SIGHUP reloads at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandgate_policy::{CompiledPolicy, PolicyError};
use tokio::sync::watch;

use crate::metrics::ProxyMetrics;

/// A policy that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read policy {path}: {source}; check the path and its permissions")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The document is invalid.
    #[error(transparent)]
    Invalid(#[from] PolicyError),
}

/// Reads and compiles the policy at `path`, or the embedded default when `path` is `None`.
pub fn load_policy(path: Option<&Path>) -> Result<CompiledPolicy, LoadError> {
    let Some(path) = path else {
        return Ok(sandgate_policy::embedded_default()?);
    };
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    Ok(CompiledPolicy::from_yaml(&path.display().to_string(), &text)?)
}

#[derive(PartialEq, Eq)]
struct Fingerprint(u64, Option<SystemTime>, u64);

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Fingerprint(m.len(), m.modified().ok(), m.ino()))
}

/// Reloads the policy on SIGHUP and when the file changes, until the sender's receivers are
/// all gone.
pub(crate) async fn watch_policy(
    path: Option<PathBuf>,
    tx: watch::Sender<Arc<CompiledPolicy>>,
    metrics: ProxyMetrics,
    poll: Duration,
) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("cannot listen for SIGHUP ({e}); policy reload on signal is off");
            None
        }
    };
    let mut seen = path.as_deref().and_then(fingerprint);
    loop {
        let why = tokio::select! {
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => "SIGHUP",
            () = tokio::time::sleep(poll) => {
                let now = path.as_deref().and_then(fingerprint);
                if now == seen || now.is_none() {
                    continue;
                }
                seen = now;
                "file changed"
            }
            () = tx.closed() => return,
        };
        let Some(p) = path.as_deref() else {
            tracing::info!("SIGHUP: running on the embedded default policy; nothing to reload");
            continue;
        };
        match load_policy(Some(p)) {
            Ok(policy) => {
                metrics.reloads.with_label_values(&["ok"]).inc();
                tracing::info!(policy = %p.display(), trigger = why, "policy reloaded");
                tx.send_replace(Arc::new(policy));
            }
            Err(e) => {
                metrics.reloads.with_label_values(&["error"]).inc();
                tracing::error!(policy = %p.display(), trigger = why, "policy reload failed, keeping the running policy: {e}");
            }
        }
    }
}
