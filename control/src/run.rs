//! `sandgate run -- CMD`: the local provider's first slice. It makes a sandbox that can reach
//! only what the policy allows, runs CMD in it with stdio passed through, returns CMD's exit
//! status and removes everything it made.
//!
//! The process running `sandgate run` is the gateway: the sandbox's network namespace is
//! attached to it by a veth, the proxy (explicit, transparent and DNS listeners) runs in it on
//! the gateway address, and the rules that make the proxy the only way out are loaded in it, in
//! a table of the sandbox's own. CMD runs under bubblewrap inside the sandbox's namespace with
//! its own PID, IPC and UTS namespaces, every capability dropped, the host filesystem read-only,
//! a private /tmp and a writable workspace at /workspace.
//!
//! Limits: CPUs, memory without swap and pids through cgroups (v2 or v1), and a lifetime past
//! which the sandbox is stopped; what a limit did (an OOM kill, refused forks, expiry) is
//! reported when CMD ends.
//!
//! State: each sandbox is a row in SQLite, written (intent) before anything is made and ended
//! with its cause; the reaper runs first and removes what crashed owners left.
//!
//! Not yet here (issue 4 continues): the workspace disk quota, pause/resume, `sandbox
//! create/ls/exec/rm`.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use sandgate_policy::CompiledPolicy;
use sandgate_proxy::ProxyConfig;
use sandgate_sidecar::{AttachConfig, SandboxLink, System, attach};

use crate::limits::{Cgroups, Limits};
use crate::reaper;
use crate::state::State;

/// The /16 that sandbox links are carved from, one /30 per sandbox.
const LINK_NET: [u8; 2] = [10, 214];
/// How often a running sandbox's owner runs the reaper.
const REAP_EVERY: Duration = Duration::from_secs(300);
/// Exit status when the sandbox cannot be made (EX_OSERR).
const EXIT_SANDBOX: u8 = 71;

/// How the command is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Isolation {
    /// bubblewrap: Linux namespaces on the host's kernel.
    Bwrap,
    /// gVisor's runsc: a user-space kernel between the command and the host's.
    Gvisor,
}

/// What to run and how.
#[derive(Debug)]
pub(crate) struct RunSpec {
    pub(crate) policy: CompiledPolicy,
    pub(crate) policy_path: Option<PathBuf>,
    pub(crate) workspace: Option<PathBuf>,
    pub(crate) state_dir: PathBuf,
    pub(crate) limits: Limits,
    pub(crate) disk: u64,
    pub(crate) isolation: Isolation,
    pub(crate) profile: Option<String>,
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) vault: Option<PathBuf>,
    pub(crate) vault_key_file: PathBuf,
    pub(crate) upstream_ca: Vec<PathBuf>,
    pub(crate) command: Vec<String>,
}

/// Everything made for one sandbox, removed in reverse order.
struct Made {
    id: String,
    netns: Option<String>,
    table: Option<String>,
    cgroups: Option<Cgroups>,
    disk: Option<crate::disk::Mounted>,
}

impl Drop for Made {
    fn drop(&mut self) {
        if let Some(c) = self.cgroups.take() {
            c.kill_all();
            c.remove();
        }
        if let Some(d) = self.disk.take() {
            d.unmount();
        }
        if let Some(t) = self.table.take()
            && let Err(e) = attach::remove_table(&mut System, None, &t)
        {
            tracing::warn!(sandbox = %self.id, "removing table {t}: {e}");
        }
        if let Some(ns) = self.netns.take()
            && let Err(e) = System.run_ip_netns_del(&ns)
        {
            tracing::warn!(sandbox = %self.id, "removing namespace {ns}: {e}");
        }
    }
}

trait NetnsDel {
    fn run_ip_netns_del(&mut self, ns: &str) -> Result<(), sandgate_sidecar::AttachError>;
}

impl NetnsDel for System {
    fn run_ip_netns_del(&mut self, ns: &str) -> Result<(), sandgate_sidecar::AttachError> {
        use sandgate_sidecar::Run;
        self.run("ip", &["netns", "del", ns], None).map(|_| ())
    }
}

/// Runs the command in a new sandbox and returns its exit status.
pub(crate) fn run(spec: RunSpec) -> ExitCode {
    if let Err(why) = preflight() {
        eprintln!("sandgate run: {why}");
        return ExitCode::from(EXIT_SANDBOX);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandgate run: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_SANDBOX);
        }
    };
    match runtime.block_on(run_inner(spec)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sandgate run: {e}");
            ExitCode::from(EXIT_SANDBOX)
        }
    }
}

fn preflight() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("needs root: it creates a network namespace and nftables rules".into());
    }
    for (tool, pkg) in [("ip", "iproute2"), ("nft", "nftables"), ("bwrap", "bubblewrap")] {
        let found = std::process::Command::new(tool).arg("--version").output().is_ok();
        if !found {
            return Err(format!("`{tool}` is missing; install it with `apt-get install {pkg}` (or run scripts/setup)"));
        }
    }
    Ok(())
}

/// A sandbox id: six hex digits from four random bytes.
fn id_from(raw: [u8; 4]) -> String {
    format!("{:06x}", u32::from_be_bytes(raw) & 0xff_ffff)
}

/// A new random sandbox id (for providers that need no link slot).
#[cfg(feature = "kubernetes")]
pub(crate) fn random_id() -> Result<String, String> {
    let mut raw = [0u8; 4];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty()).map_err(|e| format!("random id: {e}"))?;
    Ok(id_from(raw))
}

async fn run_inner(spec: RunSpec) -> Result<u8, String> {
    if let Some(p) = &spec.profile
        && spec.policy.profile_id(p).is_none()
    {
        let names: Vec<&str> = spec.policy.profile_names().collect();
        return Err(format!("the policy has no profile `{p}`; it has: {}", names.join(", ")));
    }
    let mut raw = [0u8; 4];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty()).map_err(|e| format!("random id: {e}"))?;
    let id = id_from(raw);
    // A /30 inside 10.214.0.0/16 chosen by the id: .1 the gateway, .2 the sandbox.
    let slot = u32::from_be_bytes(raw) >> 18; // 14 bits: 16,384 links
    let base = u32::from_be_bytes([LINK_NET[0], LINK_NET[1], 0, 0]) | (slot << 2);
    let link = SandboxLink {
        gateway_if: format!("sgg{id}"),
        gateway_addr: Ipv4Addr::from(base | 1),
        sandbox_addr: Ipv4Addr::from(base | 2),
    };
    // The reaper runs first, then the intent is written before anything is made.
    let state = State::open(&spec.state_dir)?;
    for line in reaper::reap(&state, &spec.state_dir) {
        eprintln!("sandgate run: reaper removed {line}");
    }
    let workspace = match spec.workspace.clone() {
        Some(w) => w,
        None => std::env::temp_dir().join(format!("sandgate-workspace-{id}")),
    };
    let netns = format!("sandgate-{id}");
    let table = format!("sandgate-{id}");
    let l = &spec.limits;
    state.intend(&id, l.lifetime, l.cpus, l.memory, l.pids, &netns, &table, &workspace)?;
    let isolation = match spec.isolation {
        Isolation::Bwrap => "bwrap",
        Isolation::Gvisor => "gvisor",
    };
    state.set_isolation(&id, isolation)?;
    if spec.isolation == Isolation::Gvisor && std::process::Command::new("runsc").arg("--version").output().is_err() {
        return Err("--isolation gvisor needs gVisor's runsc; install it with `apt-get install runsc`".into());
    }
    let mut made = Made { id: id.clone(), netns: None, table: None, cgroups: None, disk: None };
    // Recorded first: a failure half-way through attaching still removes the namespace.
    made.netns = Some(netns.clone());
    attach::attach(&mut System, None, &netns, &format!("sgs{id}"), &link).map_err(|e| e.to_string())?;
    tracing::info!(sandbox = %id, netns = %netns, gateway = %link.gateway_addr, "sandbox network attached");

    // The proxy listens on the gateway address, on ports the kernel picks.
    let gw = std::net::IpAddr::V4(link.gateway_addr);
    let metrics = sandgate_proxy::ProxyMetrics::for_sandbox(&id).map_err(|e| e.to_string())?;
    let interceptor = crate::build_interceptor(
        &spec.policy,
        spec.vault.as_deref(),
        &spec.vault_key_file,
        &spec.upstream_ca,
        &metrics,
    )
    .map_err(|(_, e)| e)?;
    let ca_pem = interceptor.as_ref().map(|i| i.ca_cert_pem().to_owned());
    let config = ProxyConfig {
        explicit: Some(SocketAddr::new(gw, 0)),
        transparent: Some(SocketAddr::new(gw, 0)),
        dns: Some(SocketAddr::new(gw, 0)),
        admin: spec.admin,
        policy_path: spec.policy_path.clone(),
        workers: 1,
        limits: sandgate_proxy::Limits::default(),
        interceptor,
        metrics: Some(metrics),
        sandbox: Some(id.clone()),
        profile: spec.profile.clone(),
        ..ProxyConfig::default()
    };
    let running = sandgate_proxy::start(config, spec.policy).await.map_err(|e| e.to_string())?;
    if let Some(admin) = running.admin {
        tracing::info!(target: "sandgate::listen", sandbox = %id, listener = "admin", %admin, "listening");
    }
    let (Some(explicit), Some(transparent), Some(dns)) = (running.explicit, running.transparent, running.dns) else {
        return Err("the proxy did not open its listeners".into());
    };
    let rules = AttachConfig {
        table: table.clone(),
        transparent_port: transparent.port(),
        dns_port: dns.port(),
        explicit_port: Some(explicit.port()),
        links: vec![link.clone()],
    };
    attach::apply_rules(&mut System, None, &rules).map_err(|e| e.to_string())?;
    made.table = Some(table);

    startup_check(&netns, explicit).await?;
    let mounted = crate::disk::mount(&workspace, spec.disk, &crate::disk::mountpoint(&spec.state_dir, &id))?;
    let workspace_mount = mounted.mountpoint.clone();
    made.disk = Some(mounted);
    let cgroups = Cgroups::create(&id, &spec.limits)?;
    let procs: Vec<String> = cgroups.procs_files().iter().map(|p| p.to_string_lossy().into_owned()).collect();
    made.cgroups = Some(cgroups);
    let proxy_url = format!("http://{explicit}");
    // Sandgate's CA, when there is one: a bundle of the system roots plus it, for tools that
    // replace their roots (SSL_CERT_FILE, ...), and the CA alone for Node, which adds to its own.
    let trust = match &ca_pem {
        Some(pem) => Some(trust_files(&spec.state_dir, &id, pem)?),
        None => None,
    };
    // Bound into the sandbox's private /run, whatever the state directory is.
    const BUNDLE_IN: &str = "/run/sandgate/ca-bundle.pem";
    const CA_IN: &str = "/run/sandgate/ca.pem";
    let binds: Vec<(&Path, &str)> =
        trust.iter().flat_map(|(b, c)| [(b.as_path(), BUNDLE_IN), (c.as_path(), CA_IN)]).collect();
    // A small shell enters the cgroups itself before exec-ing the sandbox, so nothing the
    // sandbox starts can run outside its limits (no window between spawn and move).
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args([
        "-c",
        r#"for f in $SANDGATE_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; if [ -n "$SANDGATE_SECCOMP" ]; then exec 9<"$SANDGATE_SECCOMP"; fi; exec "$@""#,
        "sandgate-enter",
    ])
    .env("SANDGATE_CGROUP_PROCS", procs.join(" "));
    let mut seccomp_file = None;
    let runsc_root = spec.state_dir.join("runsc");
    let bundle = runsc_root.join(format!("bundle-{id}"));
    match spec.isolation {
        Isolation::Bwrap => {
            // bubblewrap reads the compiled filter from a descriptor: the shell opens it as fd 9.
            std::fs::create_dir_all(&runsc_root).map_err(|e| format!("{}: {e}", runsc_root.display()))?;
            let filter = spec.state_dir.join(format!("seccomp-{id}.bpf"));
            std::fs::write(&filter, crate::seccomp::filter_bytes()?)
                .map_err(|e| format!("{}: {e}", filter.display()))?;
            seccomp_file = Some(filter.clone());
            cmd.env("SANDGATE_SECCOMP", &filter)
                .args(["ip", "netns", "exec", &netns, "bwrap", "--seccomp", "9"])
                .args(bwrap_args(&workspace_mount, &id, &binds)?)
                .arg("--")
                .args(&spec.command);
        }
        Isolation::Gvisor => {
            let mut env = vec![format!(
                "PATH={}",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
            )];
            env.extend(["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"].map(|v| format!("{v}={proxy_url}")));
            if trust.is_some() {
                env.extend(
                    ["SSL_CERT_FILE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"]
                        .map(|v| format!("{v}={BUNDLE_IN}")),
                );
                env.push(format!("NODE_EXTRA_CA_CERTS={CA_IN}"));
            }
            write_oci_bundle(&bundle, &workspace_mount, &id, &binds, &spec.command, &env)?;
            // nsenter, not `ip netns exec`: this runsc refuses a remounted /sys. The network is
            // the sandbox's namespace (host networking of runsc, inside it).
            cmd.arg("nsenter")
                .arg(format!("--net=/var/run/netns/{netns}"))
                .arg("runsc")
                .arg("--root")
                .arg(runsc_root.join("state"))
                .args(["--network=host", "--ignore-cgroups", "run", "--bundle"])
                .arg(&bundle)
                .arg(format!("sandgate-{id}"));
        }
    }
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        cmd.env(var, &proxy_url);
    }
    cmd.env_remove("NO_PROXY").env_remove("no_proxy").env_remove("ALL_PROXY").env_remove("all_proxy");
    if trust.is_some() {
        for var in ["SSL_CERT_FILE", "GIT_SSL_CAINFO", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"] {
            cmd.env(var, BUNDLE_IN);
        }
        cmd.env("NODE_EXTRA_CA_CERTS", CA_IN);
    } else {
        // The host's own CA settings would point the sandbox at files it may not see.
        for var in [
            "SSL_CERT_FILE",
            "GIT_SSL_CAINFO",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "CURL_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
        ] {
            cmd.env_remove(var);
        }
    }
    tracing::info!(sandbox = %id, workspace = %workspace.display(), "running {:?}", spec.command);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the sandbox: {e}"))?;
    state.set_proxy(&id, &proxy_url)?;
    state.set_state(&id, "running")?;
    let lifetime = spec.limits.lifetime;
    // SIGTERM (`sandgate sandbox rm`) or SIGINT stops the sandbox and still cleans up.
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let kill = |made: &Made, child: &mut tokio::process::Child| {
        if let Some(c) = &made.cgroups {
            c.kill_all();
        }
        let _ = child.start_kill();
    };
    // The reaper also runs periodically while this sandbox lives, for sandboxes whose owners
    // died meanwhile (a long-lived `sandbox create` keeps it going).
    let reaper_state = spec.state_dir.clone();
    let own_id = id.clone();
    let reaper = tokio::spawn(async move {
        loop {
            tokio::time::sleep(REAP_EVERY).await;
            let dir = reaper_state.clone();
            let removed =
                tokio::task::spawn_blocking(move || State::open(&dir).map(|s| crate::reaper::reap(&s, &dir))).await;
            if let Ok(Ok(lines)) = removed {
                for line in lines {
                    tracing::info!(sandbox = %own_id, "periodic reaper removed {line}");
                }
            }
        }
    });
    let (status, expired, removed) = tokio::select! {
        s = child.wait() => (s, false, false),
        () = tokio::time::sleep(lifetime) => {
            kill(&made, &mut child);
            (child.wait().await, true, false)
        }
        _ = term.recv() => {
            kill(&made, &mut child);
            (child.wait().await, false, true)
        }
        _ = int.recv() => {
            kill(&made, &mut child);
            (child.wait().await, false, true)
        }
    };
    reaper.abort();
    let status = status.map_err(|e| format!("waiting for the sandbox: {e}"))?;
    let code = status.code().map_or(128 + 9, |c| u8::try_from(c).unwrap_or(1));
    let outcome = made.cgroups.as_ref().map(Cgroups::outcome).unwrap_or_default();
    // Why the sandbox stopped, when a limit stopped it.
    if expired {
        eprintln!(
            "sandgate run: sandbox {id} stopped: its lifetime of {} expired",
            humantime::format_duration(lifetime)
        );
        tracing::warn!(sandbox = %id, cause = "lifetime_expired", "sandbox stopped");
    }
    if outcome.oom_killed {
        eprintln!(
            "sandgate run: sandbox {id}: a process was killed for exceeding the memory limit ({} MiB)",
            spec.limits.memory >> 20
        );
        tracing::warn!(sandbox = %id, cause = "oom_killed", "memory limit reached");
    }
    if outcome.pids_limited {
        eprintln!("sandgate run: sandbox {id}: reached its pids limit ({}); forks were refused", spec.limits.pids);
        tracing::warn!(sandbox = %id, cause = "pids_limit", "pids limit reached");
    }
    let cause = if removed {
        "removed"
    } else if expired {
        "lifetime_expired"
    } else if outcome.oom_killed {
        "oom_killed"
    } else if outcome.pids_limited {
        "pids_limit"
    } else {
        "exited"
    };
    let left = running.drain().await;
    if let Some(f) = &seccomp_file {
        let _ = std::fs::remove_file(f);
    }
    if spec.isolation == Isolation::Gvisor {
        let _ = std::process::Command::new("runsc")
            .arg("--root")
            .arg(runsc_root.join("state"))
            .args(["delete", "-force", &format!("sandgate-{id}")])
            .output();
        let _ = std::fs::remove_dir_all(&bundle);
    }
    drop(made);
    if let Some((bundle, ca)) = &trust {
        let _ = std::fs::remove_file(bundle);
        let _ = std::fs::remove_file(ca);
    }
    state.end(&id, "stopped", cause, status.code())?;
    tracing::info!(sandbox = %id, status = code, open_connections = left, "sandbox removed");
    Ok(code)
}

/// Writes the trust files for sandbox `id`: (system roots + Sandgate's CA, Sandgate's CA).
/// They live in the state directory, which the sandbox sees read-only like the rest of the host.
fn trust_files(state_dir: &Path, id: &str, ca_pem: &str) -> Result<(PathBuf, PathBuf), String> {
    let dir = state_dir.join("trust");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = dir.join(format!("sandgate-{id}-ca.pem"));
    let bundle = dir.join(format!("sandgate-{id}-bundle.pem"));
    let system = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    std::fs::write(&ca, ca_pem).map_err(|e| format!("{}: {e}", ca.display()))?;
    std::fs::write(&bundle, format!("{system}\n{ca_pem}")).map_err(|e| format!("{}: {e}", bundle.display()))?;
    Ok((bundle, ca))
}

/// Proves the rules are in force before CMD runs: from inside the sandbox, the proxy answers on
/// the gateway, and a direct connection to an outside address is taken by the proxy (which
/// refuses it) instead of going anywhere.
async fn startup_check(netns: &str, explicit: SocketAddr) -> Result<(), String> {
    let ns = PathBuf::from("/var/run/netns").join(netns);
    tokio::task::spawn_blocking(move || -> Result<(), String> {
        let f = std::fs::File::open(&ns).map_err(|e| format!("{}: {e}", ns.display()))?;
        rustix::thread::move_into_link_name_space(f.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
            .map_err(|e| format!("entering the sandbox's namespace: {e}"))?;
        std::net::TcpStream::connect_timeout(&explicit, Duration::from_secs(2)).map_err(|e| {
            format!("start-up check: the proxy does not answer on {explicit} from inside the sandbox: {e}")
        })?;
        use std::io::{Read, Write};
        // 198.18.0.0/15 is reserved for benchmarks and never routed: only the redirect can answer.
        let outside: SocketAddr = "198.18.0.1:9".parse().map_err(|_| "address".to_owned())?;
        let mut s = std::net::TcpStream::connect_timeout(&outside, Duration::from_secs(2)).map_err(|e| {
            format!(
                "start-up check: a direct connection was not redirected to the proxy ({e}); the rules are not in force"
            )
        })?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        let _ = s.write_all(b"sandgate start-up check\n");
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(0) => Ok(()),
            Ok(_) => Err("start-up check: a direct connection got an answer; the rules are not in force".into()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(format!("start-up check: the proxy did not refuse a direct connection ({e})")),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Writes an OCI bundle for runsc: the host's root read-only, fresh /proc, /tmp and /run, the
/// workspace writable at /workspace, the trust files read-only, no capabilities, no new
/// privileges, new PID, IPC, UTS and mount namespaces (the network is the sandbox's own).
fn write_oci_bundle(
    dir: &Path,
    workspace: &Path,
    id: &str,
    files: &[(&Path, &str)],
    command: &[String],
    env: &[String],
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut mounts = vec![
        serde_json::json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        serde_json::json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}),
        serde_json::json!({"destination": "/run", "type": "tmpfs", "source": "tmpfs"}),
        serde_json::json!({"destination": "/workspace", "type": "bind", "source": workspace, "options": ["rbind", "rw"]}),
    ];
    for (host, inside) in files {
        mounts.push(
            serde_json::json!({"destination": inside, "type": "bind", "source": host, "options": ["rbind", "ro"]}),
        );
    }
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": command,
            "env": env,
            "cwd": "/workspace",
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "noNewPrivileges": true
        },
        "root": {"path": "/", "readonly": true},
        "hostname": format!("sandgate-{id}"),
        "mounts": mounts,
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]}
    });
    std::fs::write(dir.join("config.json"), config.to_string()).map_err(|e| format!("{}: {e}", dir.display()))
}

/// bubblewrap's arguments: the host's top-level directories read-only (symlinks kept, so a
/// merged /usr works), fresh /dev, /proc and /tmp, the workspace writable at /workspace, new
/// PID, IPC and UTS namespaces, every capability dropped, its own session.
fn bwrap_args(workspace: &Path, id: &str, files: &[(&Path, &str)]) -> Result<Vec<String>, String> {
    let mut args: Vec<String> = Vec::new();
    let skip = ["proc", "dev", "sys", "tmp", "run", "workspace", "lost+found"];
    let entries = std::fs::read_dir("/").map_err(|e| format!("listing /: {e}"))?;
    let mut names: Vec<_> = entries.filter_map(Result::ok).collect();
    names.sort_by_key(std::fs::DirEntry::file_name);
    for e in names {
        let name = e.file_name().to_string_lossy().into_owned();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let path = format!("/{name}");
        match std::fs::read_link(&path) {
            Ok(target) => args.extend(["--symlink".into(), target.to_string_lossy().into_owned(), path]),
            Err(_) if e.path().is_dir() => args.extend(["--ro-bind".into(), path.clone(), path]),
            Err(_) => {}
        }
    }
    args.extend(
        ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run", "--ro-bind-try", "/sys", "/sys"]
            .map(String::from),
    );
    args.extend(["--bind".into(), workspace.to_string_lossy().into_owned(), "/workspace".into()]);
    for (host, inside) in files {
        args.extend(["--ro-bind".into(), host.to_string_lossy().into_owned(), (*inside).to_owned()]);
    }
    args.extend(
        [
            "--chdir",
            "/workspace",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
        ]
        .map(String::from),
    );
    args.extend(["--hostname".into(), format!("sandgate-{id}")]);
    Ok(args)
}
