//! The reaper: removes every sandbox past its lifetime and every orphan, a network namespace,
//! nftables table or cgroup of Sandgate's whose owner is gone, even when that owner was killed
//! with SIGKILL. It runs at every `sandgate run` and as `sandgate reap` (for a timer). It is
//! idempotent and logs what it removed. Tables are removed from the network namespace the
//! reaper runs in (the gateway's).

use std::collections::HashSet;

use sandgate_sidecar::{Run, System, attach};

use crate::limits;
use crate::state::{State, now, process_start};

/// Runs the reaper; returns one line per thing removed. `state_dir` holds the workspace
/// mounts.
pub(crate) fn reap(state: &State, state_dir: &std::path::Path) -> Vec<String> {
    let mut removed = Vec::new();
    let mut keep = HashSet::new();
    match state.live() {
        Ok(rows) => {
            for row in rows {
                let alive = process_start(row.owner_pid) == Some(row.owner_start);
                let expired = now() >= row.expires_at;
                if alive && !expired {
                    keep.insert(row.id.clone());
                    continue;
                }
                let cause = if alive { "expired" } else { "owner_died" };
                for (id, dir) in limits::existing_groups() {
                    if id == row.id {
                        limits::destroy_group(&dir);
                    }
                }
                let _ = attach::remove_table(&mut System, None, &row.nft_table);
                crate::disk::unmount_dir(&crate::disk::mountpoint(state_dir, &row.id));
                let _ = System.run("ip", &["netns", "del", &row.netns], None);
                if let Err(e) = state.end(&row.id, "reaped", cause, None) {
                    tracing::warn!(sandbox = %row.id, "reaper: {e}");
                }
                tracing::info!(sandbox = %row.id, cause, was = %row.state, "reaper removed a sandbox");
                removed.push(format!("sandbox {} ({cause}, was {})", row.id, row.state));
            }
        }
        Err(e) => tracing::warn!("reaper: {e}"),
    }
    // Orphans that no live sandbox owns.
    for (id, dir) in limits::existing_groups() {
        if !keep.contains(&id) {
            limits::destroy_group(&dir);
            tracing::info!(sandbox = %id, dir = %dir.display(), "reaper removed an orphaned cgroup");
            removed.push(format!("cgroup {}", dir.display()));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/var/run/netns") {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("sandgate-")
                && !keep.contains(id)
                && System.run("ip", &["netns", "del", &name], None).is_ok()
            {
                tracing::info!(sandbox = %id, "reaper removed an orphaned network namespace");
                removed.push(format!("netns {name}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(state_dir.join("mnt")) {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("sandgate-")
                && !keep.contains(id)
            {
                crate::disk::unmount_dir(&e.path());
                tracing::info!(sandbox = %id, "reaper unmounted an orphaned workspace");
                removed.push(format!("workspace mount {name}"));
            }
        }
    }
    if let Ok(tables) = System.run("nft", &["list", "tables"], None) {
        for line in tables.lines() {
            let Some(name) = line.strip_prefix("table inet ") else { continue };
            if let Some(id) = name.strip_prefix("sandgate-")
                && !keep.contains(id)
                && attach::remove_table(&mut System, None, name).is_ok()
            {
                tracing::info!(sandbox = %id, "reaper removed an orphaned nftables table");
                removed.push(format!("table {name}"));
            }
        }
    }
    removed
}
