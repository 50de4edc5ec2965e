//! `sandgate sandbox ls | pause | resume | rm`: managing local sandboxes that `sandgate run`
//! owns, through the state database and their cgroups.

use std::process::ExitCode;
use std::time::Duration;

use crate::limits;
use crate::state::{State, now, process_start};

/// Exit status for a sandbox that does not exist or is not in the right state.
const EXIT_NO_SANDBOX: u8 = 1;

/// Prints every sandbox, newest first.
pub(crate) fn ls(state: &State) -> ExitCode {
    match state.list() {
        Ok(rows) => {
            println!("{:<8} {:<9} {:<17} {:>8} {:>10}  WORKSPACE", "ID", "STATE", "CAUSE", "AGE", "EXPIRES IN");
            for (id, st, cause, created, expires, _, ws) in rows {
                let age = humantime::format_duration(Duration::from_secs(u64::try_from(now() - created).unwrap_or(0)));
                let left = if matches!(st.as_str(), "running" | "paused" | "creating") {
                    humantime::format_duration(Duration::from_secs(u64::try_from(expires - now()).unwrap_or(0)))
                        .to_string()
                } else {
                    "-".to_owned()
                };
                println!("{id:<8} {st:<9} {:<17} {age:>8} {left:>10}  {ws}", cause.unwrap_or_else(|| "-".into()));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate sandbox ls: {e}");
            ExitCode::from(EXIT_NO_SANDBOX)
        }
    }
}

/// Freezes or thaws a running sandbox; its processes and workspace are kept as they are.
pub(crate) fn pause(state: &State, id: &str, frozen: bool) -> ExitCode {
    let (from, to, verb) = if frozen { ("running", "paused", "paused") } else { ("paused", "running", "resumed") };
    match state.status(id) {
        Ok(Some((st, _))) if st == from => {}
        Ok(Some((st, _))) => {
            eprintln!("sandgate sandbox: {id} is {st}, not {from}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Ok(None) => {
            eprintln!("sandgate sandbox: no sandbox {id}; `sandgate sandbox ls` lists them");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Err(e) => {
            eprintln!("sandgate sandbox: {e}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
    }
    match limits::freeze(id, frozen).and_then(|()| state.set_state(id, to)) {
        Ok(()) => {
            eprintln!("sandgate sandbox: {id} {verb}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate sandbox: {e}");
            ExitCode::from(EXIT_NO_SANDBOX)
        }
    }
}

/// Stops a sandbox: its owner is asked to stop (SIGTERM) and cleans up; an owner that is gone
/// leaves it to the reaper, which runs here.
pub(crate) fn rm(state: &State, state_dir: &std::path::Path, id: &str) -> ExitCode {
    let live = state.live().unwrap_or_default();
    let Some(row) = live.into_iter().find(|r| r.id == id) else {
        eprintln!("sandgate sandbox: {id} is not running (`sandgate sandbox ls`)");
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    if process_start(row.owner_pid) == Some(row.owner_start)
        && let Some(pid) = i32::try_from(row.owner_pid).ok().and_then(rustix::process::Pid::from_raw)
    {
        let _ = limits::freeze(id, false);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        for _ in 0..200 {
            if !matches!(state.status(id), Ok(Some((ref s, _))) if matches!(s.as_str(), "running" | "paused" | "creating"))
            {
                eprintln!("sandgate sandbox: {id} removed");
                return ExitCode::SUCCESS;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for line in crate::reaper::reap(state, state_dir) {
        eprintln!("sandgate sandbox: removed {line}");
    }
    ExitCode::SUCCESS
}

/// Creates a long-lived sandbox: a detached `sandgate run` whose command idles, so that
/// `sandbox exec` can run commands in it until `sandbox rm` or its lifetime. `run_args` are
/// `sandgate run`'s options (limits, policy, workspace, vault). Prints the id.
pub(crate) fn create(state: &State, state_dir: &std::path::Path, run_args: &[String]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let Ok(exe) = std::env::current_exe() else {
        eprintln!("sandgate sandbox create: cannot find the sandgate binary");
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    let log_path = state_dir.join("sandbox-create.log");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path);
    let (Ok(out), Ok(err)) = (log.as_ref().map(|f| f.try_clone()), log.as_ref().map(|f| f.try_clone())) else {
        eprintln!("sandgate sandbox create: cannot open {}", log_path.display());
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    let (Ok(out), Ok(err)) = (out, err) else {
        eprintln!("sandgate sandbox create: cannot open {}", log_path.display());
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    let child = std::process::Command::new(exe)
        .arg("run")
        .arg("--state")
        .arg(state_dir)
        .args(run_args)
        .args(["--", "sh", "-c", "while :; do sleep 3600; done"])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: the sandbox outlives this command and its terminal.
        .process_group(0)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandgate sandbox create: {e}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
    };
    for _ in 0..200 {
        if let Ok(Some(id)) = state.owned_by(child.id()) {
            println!("{id}");
            return ExitCode::SUCCESS;
        }
        if process_start(i64::from(child.id())).is_none() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("sandgate sandbox create: the sandbox did not start; see {}", log_path.display());
    ExitCode::from(EXIT_NO_SANDBOX)
}

/// Runs `command` inside sandbox `id`: its network, mount, PID, UTS and IPC namespaces, its
/// cgroups, every capability dropped and no new privileges, with the proxy variables set.
/// Stdio is passed through; the exit status is the command's.
pub(crate) fn exec(state: &State, id: &str, command: &[String]) -> ExitCode {
    let (owner, proxy) = match state.owner_and_proxy(id) {
        Ok(Some((_, _, Some(iso)))) if iso == "gvisor" => {
            eprintln!("sandgate sandbox exec: {id} runs under gVisor; exec enters bwrap sandboxes only (for now)");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Ok(Some((owner, proxy, _))) => (owner, proxy),
        Ok(None) => {
            eprintln!("sandgate sandbox exec: {id} is not running (`sandgate sandbox ls`)");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
        Err(e) => {
            eprintln!("sandgate sandbox exec: {e}");
            return ExitCode::from(EXIT_NO_SANDBOX);
        }
    };
    // The sandbox's processes are those in its pids group; its init is the one in another PID
    // namespace than ours.
    let groups = limits::existing_groups();
    let procs_files: Vec<String> = groups
        .iter()
        .filter(|(g, _)| g == id)
        .map(|(_, d)| d.join("cgroup.procs").to_string_lossy().into_owned())
        .collect();
    let own_ns = std::fs::read_link("/proc/self/ns/pid").ok();
    let target = groups
        .iter()
        .filter(|(g, _)| g == id)
        .filter_map(|(_, d)| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| t.lines().filter_map(|l| l.trim().parse::<i64>().ok()).collect::<Vec<_>>())
        .find(|pid| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok() != own_ns && *pid != owner);
    let Some(target) = target else {
        eprintln!("sandgate sandbox exec: no process of {id} to join; is it running?");
        return ExitCode::from(EXIT_NO_SANDBOX);
    };
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        r#"for f in $SANDGATE_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@""#,
        "sandgate-enter",
    ])
    .env("SANDGATE_CGROUP_PROCS", procs_files.join(" "))
    .arg("nsenter")
    .arg(format!("--target={target}"))
    .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd"])
    .args(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"])
    .args(command);
    if let Some(url) = proxy {
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            cmd.env(var, &url);
        }
    }
    cmd.env_remove("NO_PROXY").env_remove("no_proxy");
    match cmd.status() {
        Ok(s) => ExitCode::from(s.code().map_or(137, |c| u8::try_from(c).unwrap_or(1))),
        Err(e) => {
            eprintln!("sandgate sandbox exec: {e}");
            ExitCode::from(EXIT_NO_SANDBOX)
        }
    }
}
