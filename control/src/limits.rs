//! Resource limits of a local sandbox through cgroups: v2 (`memory.max`, `memory.swap.max`,
//! `cpu.max`, `pids.max`) where the host has it with the controllers delegated, v1
//! (`memory.limit_in_bytes` and `memory.memsw.limit_in_bytes`, `cpu.cfs_quota_us`,
//! `pids.max`) where it does not, as on hosts with hybrid cgroups. Groups are made under this
//! process's own cgroup (never moving anything out of it), and removed with the sandbox.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The seed's defaults: 2 CPUs, 2048 MB without swap, a pids limit, 6 hours at most.
pub(crate) const DEFAULT_CPUS: f64 = 2.0;
/// Processes and threads by default: plenty for builds, a wall for fork bombs.
pub(crate) const DEFAULT_PIDS: u64 = 4096;
/// The longest a sandbox may live.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(6 * 3600);
/// CFS period used for the CPU quota.
const CPU_PERIOD_US: u64 = 100_000;

/// A sandbox's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) cpus: f64,
    pub(crate) memory: u64,
    pub(crate) pids: u64,
    pub(crate) lifetime: Duration,
}

/// The cgroups made for one sandbox.
#[derive(Debug)]
pub(crate) enum Cgroups {
    /// One group per v1 controller: (controller, directory).
    V1(Vec<(&'static str, PathBuf)>),
    /// One v2 group.
    V2(PathBuf),
}

/// What the limits did to the sandbox.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) oom_killed: bool,
    pub(crate) pids_limited: bool,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("cgroup: writing {value:?} to {}: {e}", path.display()))
}

/// This process's path in the hierarchy of `controller` (v1), or in the v2 tree (`""`).
fn own_path(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_owned())
    })
}

// === impl Cgroups ===

impl Cgroups {
    /// Makes the groups for sandbox `id` and writes the limits.
    pub(crate) fn create(id: &str, limits: &Limits) -> Result<Self, String> {
        let name = format!("sandgate-{id}");
        let root = Path::new("/sys/fs/cgroup");
        let v2_controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let quota = format!("{} {CPU_PERIOD_US}", ((limits.cpus * CPU_PERIOD_US as f64) as u64).max(1000));
        if ["memory", "cpu", "pids"].iter().all(|c| v2_controllers.split_whitespace().any(|x| x == *c)) {
            let parent = root.join(own_path("").unwrap_or_default().trim_start_matches('/'));
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).map_err(|e| format!("cgroup: creating {}: {e}", dir.display()))?;
            let group = Self::V2(dir.clone());
            write(&dir.join("memory.max"), &limits.memory.to_string())?;
            write(&dir.join("memory.swap.max"), "0")?;
            write(&dir.join("cpu.max"), &quota)?;
            write(&dir.join("pids.max"), &limits.pids.to_string())?;
            return Ok(group);
        }
        let mut dirs = Vec::new();
        for controller in ["memory", "cpu", "pids"] {
            let base = root.join(controller);
            if !base.join("cgroup.procs").exists() {
                let made = Self::V1(dirs);
                made.remove();
                return Err(format!(
                    "cgroup: neither cgroup v2 with {controller} nor a v1 {controller} hierarchy is visible under /sys/fs/cgroup \
                     (`ip netns exec` mounts a fresh /sys that hides it; enter a namespace with `nsenter --net=...` instead)"
                ));
            }
            let dir = base.join(own_path(controller).unwrap_or_default().trim_start_matches('/')).join(&name);
            if let Err(e) = std::fs::create_dir(&dir) {
                Self::V1(dirs).remove();
                return Err(format!("cgroup: creating {}: {e}", dir.display()));
            }
            dirs.push((controller, dir));
        }
        // The freezer (for pause) is optional: without it, pause says so.
        let freezer = root.join("freezer");
        if freezer.join("cgroup.procs").exists() {
            let dir = freezer.join(own_path("freezer").unwrap_or_default().trim_start_matches('/')).join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                dirs.push(("freezer", dir));
            }
        }
        let group = Self::V1(dirs);
        let dir = |c: &str| group.v1_dir(c);
        let mem = dir("memory");
        write(&mem.join("memory.limit_in_bytes"), &limits.memory.to_string())?;
        // No swap: the memory+swap limit equals the memory limit (when swap is accounted).
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &limits.memory.to_string())?;
        }
        let cpu = dir("cpu");
        write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
        write(&cpu.join("cpu.cfs_quota_us"), quota.split(' ').next().unwrap_or("-1"))?;
        write(&dir("pids").join("pids.max"), &limits.pids.to_string())?;
        Ok(group)
    }

    fn v1_dir(&self, controller: &str) -> PathBuf {
        match self {
            Self::V1(dirs) => dirs.iter().find(|(c, _)| *c == controller).map(|(_, d)| d.clone()).unwrap_or_default(),
            Self::V2(d) => d.clone(),
        }
    }

    /// The `cgroup.procs` files a process writes its pid to, to enter every group.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        match self {
            Self::V1(dirs) => dirs.iter().map(|(_, d)| d.join("cgroup.procs")).collect(),
            Self::V2(d) => vec![d.join("cgroup.procs")],
        }
    }

    /// Kills every process in the sandbox (lifetime expired, removed).
    pub(crate) fn kill_all(&self) {
        let thaw = self.v1_dir("freezer").join("freezer.state");
        if thaw.exists() {
            let _ = std::fs::write(thaw, "THAWED");
        }
        if let Self::V2(d) = self
            && std::fs::write(d.join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        // v1: kill what the pids group holds until it is empty (new children may appear).
        let procs = self.v1_dir("pids").join("cgroup.procs");
        for _ in 0..50 {
            let pids = std::fs::read_to_string(&procs).unwrap_or_default();
            if pids.trim().is_empty() {
                return;
            }
            for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the limits did: an OOM kill, the pids limit reached.
    pub(crate) fn outcome(&self) -> Outcome {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let counter = |text: &str, key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        match self {
            Self::V2(d) => Outcome {
                oom_killed: counter(&read(d.join("memory.events")), "oom_kill ") > 0,
                pids_limited: counter(&read(d.join("pids.events")), "max ") > 0,
            },
            Self::V1(_) => Outcome {
                oom_killed: counter(&read(self.v1_dir("memory").join("memory.oom_control")), "oom_kill ") > 0,
                pids_limited: counter(&read(self.v1_dir("pids").join("pids.events")), "max ") > 0,
            },
        }
    }

    /// Removes the groups (innermost first); they must be empty, so it waits briefly.
    pub(crate) fn remove(self) {
        let dirs: Vec<PathBuf> = match &self {
            Self::V1(dirs) => dirs.iter().map(|(_, d)| d.clone()).collect(),
            Self::V2(d) => vec![d.clone()],
        };
        for d in dirs {
            for _ in 0..50 {
                match std::fs::remove_dir(&d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// Every group directory named `sandgate-<id>` under this process's own groups (v2 and the v1
/// memory, cpu and pids hierarchies), for the reaper; `(id, directory)` pairs.
pub(crate) fn existing_groups() -> Vec<(String, PathBuf)> {
    let root = Path::new("/sys/fs/cgroup");
    let mut parents = vec![root.join(own_path("").unwrap_or_default().trim_start_matches('/'))];
    for c in ["memory", "cpu", "pids", "freezer"] {
        parents.push(root.join(c).join(own_path(c).unwrap_or_default().trim_start_matches('/')));
    }
    let mut found = Vec::new();
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else { continue };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("sandgate-")
                && e.path().is_dir()
            {
                found.push((id.to_owned(), e.path()));
            }
        }
    }
    found
}

/// Freezes (pause) or thaws (resume) sandbox `id`: cgroup v2's `cgroup.freeze`, or the v1
/// freezer's `freezer.state`. Processes keep their memory and open files; the workspace is
/// untouched.
pub(crate) fn freeze(id: &str, frozen: bool) -> Result<(), String> {
    let groups = existing_groups();
    let name = format!("sandgate-{id}");
    for (gid, dir) in &groups {
        if gid != id {
            continue;
        }
        let v2 = dir.join("cgroup.freeze");
        if v2.exists() {
            return write(&v2, if frozen { "1" } else { "0" });
        }
        let v1 = dir.join("freezer.state");
        if v1.exists() {
            return write(&v1, if frozen { "FROZEN" } else { "THAWED" });
        }
    }
    Err(format!("no freezer group {name}: is the sandbox running (and the freezer controller available)?"))
}

/// Kills every process in a group directory and removes it.
pub(crate) fn destroy_group(dir: &Path) {
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    // Frozen processes cannot die: thaw first.
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
    for _ in 0..50 {
        let pids = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Parses `2048M`, `2G`, `512K` or plain bytes.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = num.parse().map_err(|_| format!("`{s}` is not a size; write e.g. 2048M or 2G"))?;
    let mult = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("`{s}`: unknown unit `{unit}`; use K, M or G")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("2048M"), Ok(2048 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("lots").is_err());
    }
}
