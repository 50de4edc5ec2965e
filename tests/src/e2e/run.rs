//! `sandgate run` for real (root): a command in a sandbox attached to the proxy. The process
//! running `sandgate run` is the gateway, so the test starts it inside a namespace of its own.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::loopback_policy;
use crate::support::netns::{in_ns, privileged, run};
use crate::support::origin;
use crate::support::proxy::sandgate_bin;

/// A gateway network namespace of the test's own (lo up), deleted on drop: `sandgate run` in
/// it makes its sandboxes there, so the machine's root namespace is never touched.
struct Gateway(String);

impl Gateway {
    fn new(prefix: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}-{:x}{:x}", std::process::id() & 0xfff, N.fetch_add(1, Ordering::Relaxed));
        run(&["ip", "netns", "add", &name]);
        let g = Self(name);
        run(&["ip", "-n", &g.0, "link", "set", "lo", "up"]);
        g
    }

    /// A non-blocking listener on the gateway's loopback, for an origin the proxy dials.
    fn loopback_listener(&self) -> TcpListener {
        in_ns(&self.0, || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
    }

    /// `sandgate` started in the gateway namespace; nsenter rather than `ip netns exec`, which
    /// mounts a fresh /sys and hides the cgroups.
    fn sandgate(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/var/run/netns/{}", self.0)).arg(sandgate_bin());
        c
    }

    /// A plain-HTTP origin on the gateway's loopback, and a policy file (in a fresh directory)
    /// that allows only its port.
    fn plain_origin(&self) -> (origin::Origin, tempfile::TempDir, PathBuf) {
        let o = origin::serve(tokio::net::TcpListener::from_std(self.loopback_listener()).unwrap(), "plain", None);
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("policy.yaml");
        std::fs::write(&policy, loopback_policy(&[o.addr.port()])).unwrap();
        (o, dir, policy)
    }
}

/// The exit status, stdout and stderr of a finished command.
fn outcome(out: std::process::Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The network namespaces `ip netns list` shows.
fn netns_list() -> String {
    run(&["ip", "netns", "list"])
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The state directory every `sandgate run` test shares, and a lock that runs them one at a
/// time: the reaper treats a `sandgate-*` resource that no live sandbox of *its* database owns as
/// an orphan, so two tests with separate databases would reap each other's sandboxes.
fn exclusive_state() -> (std::fs::File, PathBuf) {
    let dir = std::env::temp_dir().join("sandgate-run-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::File::create(dir.join("lock")).unwrap();
    lock.lock().unwrap();
    (lock, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandgate_run_reaches_only_what_the_policy_allows() {
    if !privileged("sandgate_run_reaches_only_what_the_policy_allows") {
        return;
    }
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-run");
    let (o, dir, policy) = gateway.plain_origin();
    let port = o.addr.port();
    let workspace = dir.path().join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let sandgate_run_with = |limits: &[&str], script: &str| {
        let out = gateway
            .sandgate()
            .arg("run")
            .arg("--policy")
            .arg(&policy)
            .arg("--workspace")
            .arg(&workspace)
            .arg("--state")
            .arg(&state)
            .args(limits)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap();
        outcome(out)
    };
    let sandgate_run = |script: &str| sandgate_run_with(&[], script);

    // With the proxy variables the sandbox is given, and without them (redirected).
    let (code, out, err) = sandgate_run(&format!(
        "curl -s http://origin.test:{port}/env && curl -s --noproxy '*' --resolve origin.test:{port}:198.18.0.10 http://origin.test:{port}/direct"
    ));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("origin plain GET /env") && out.contains("origin plain GET /direct"), "{out}{err}");
    assert!(
        err.contains("\"listener\":\"explicit\"") && err.contains("\"listener\":\"transparent\""),
        "connection log on stderr: {err}"
    );

    // A sandbox can be given a profile: `reporting` (report mode) lets other.test through,
    // which the default profile refuses; an unknown profile is refused before anything starts.
    let (code, out, err) =
        sandgate_run_with(&["--profile", "reporting"], &format!("curl -s http://other.test:{port}/r"));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("origin plain GET /r"), "{out}{err}");
    assert!(err.contains("\"profile\":\"reporting\"") && err.contains("\"verdict\":\"report\""), "{err}");
    let (code, _, err) = sandgate_run_with(&["--profile", "nosuch"], "true");
    assert_eq!(code, Some(71));
    assert!(err.contains("no profile `nosuch`; it has: default, reporting"), "{err}");

    // A denied host is refused with a reason the agent can read; the exit status is CMD's.
    let (code, out, _) =
        sandgate_run("curl -s --noproxy '*' --resolve evil.test:80:198.18.0.10 http://evil.test/; exit 7");
    assert_eq!(code, Some(7));
    assert!(out.contains("sandgate: denied evil.test:80 (no rule allows this host"), "{out}");

    // Isolation: no capabilities, the host read-only, the workspace writable and kept.
    let (code, out, err) = sandgate_run(
        "grep -E 'CapEff|Seccomp:' /proc/self/status; touch /usr/sandgate-x || echo read-only; \
         unshare --user true 2>/dev/null && echo userns-allowed || echo userns-refused; echo kept > /workspace/f",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("CapEff:\t0000000000000000") && out.contains("read-only"), "{out}");
    // The seccomp filter is on and refuses new namespaces (bwrap alone would allow this one).
    assert!(out.contains("Seccomp:\t2") && out.contains("userns-refused"), "{out}");
    // The workspace (an ext4 image in the workspace directory) keeps the work for the next run.
    assert!(workspace.join("disk.img").exists());
    let (code, out, _) = sandgate_run("cat /workspace/f");
    assert_eq!((code, out.as_str()), (Some(0), "kept\n"));
    // Its size is enforced by its filesystem: writing past it fails with ENOSPC.
    let small = dir.path().join("small");
    let out = gateway
        .sandgate()
        .args(["run", "--policy"])
        .arg(&policy)
        .arg("--state")
        .arg(&state)
        .arg("--workspace")
        .arg(&small)
        .args(["--disk", "32M", "--", "dd", "if=/dev/zero", "of=/workspace/fill", "bs=1M", "count=64"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left on device"), "{err}");

    // Limits: a memory hog is OOM-killed, a fork bomb stops at the pids limit, an expired
    // sandbox is stopped; each is reported with its cause.
    let (code, _, err) = sandgate_run_with(&["--memory", "64M"], "dd if=/dev/zero of=/dev/null bs=200M count=1");
    assert_eq!(code, Some(137), "{err}");
    assert!(err.contains("killed for exceeding the memory limit (64 MiB)"), "{err}");
    let (_, out, err) =
        sandgate_run_with(&["--pids", "16"], "for i in $(seq 40); do sleep 2 & done 2>/dev/null; echo spawned; wait");
    assert!(err.contains("reached its pids limit (16)"), "{out}{err}");
    let started = std::time::Instant::now();
    let (code, _, err) = sandgate_run_with(&["--lifetime", "1s"], "sleep 30");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "not stopped at its lifetime");
    assert_eq!(code, Some(137));
    assert!(err.contains("its lifetime of 1s expired"), "{err}");
    let (_, _, err) = sandgate_run_with(&["--lifetime", "7h"], "true");
    assert!(err.contains("6h at most"), "{err}");

    // Nothing is left behind: no sandbox namespace, no table on the gateway, no cgroup.
    for controller in ["pids", "cpu"] {
        let entries: Vec<String> = std::fs::read_dir(format!("/sys/fs/cgroup/{controller}"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        assert!(!entries.iter().any(|e| e.starts_with("sandgate-")), "{controller}: {entries:?}");
    }
    let namespaces = netns_list();
    assert!(!namespaces.lines().any(|l| l.starts_with("sandgate-")), "{namespaces}");
    let tables = run(&["ip", "netns", "exec", &gateway.0, "nft", "list", "tables"]);
    assert!(!tables.contains("sandgate"), "{tables}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_removes_what_a_killed_owner_left() {
    if !privileged("the_reaper_removes_what_a_killed_owner_left") {
        return;
    }
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-reap");
    let sandgate = |args: &[&str]| {
        let mut c = gateway.sandgate();
        c.arg(args[0]).arg("--state").arg(&state).args(&args[1..]);
        c
    };
    let workspace = tempfile::tempdir().unwrap();
    let mut owner = sandgate(&["run", "--workspace", workspace.path().to_str().unwrap(), "--"])
        .args(["sleep", "60"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();

    // Wait until the sandbox exists, then kill its owner the hard way.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let netns = loop {
        let list = netns_list();
        if let Some(ns) = list.lines().filter_map(|l| l.split_whitespace().next()).find(|n| n.starts_with("sandgate-"))
        {
            break ns.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "the sandbox never appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let id = netns.trim_start_matches("sandgate-").to_owned();
    std::thread::sleep(std::time::Duration::from_millis(300));
    owner.kill().unwrap();
    owner.wait().unwrap();
    let tables = run(&["ip", "netns", "exec", &gateway.0, "nft", "list", "tables"]);
    assert!(tables.contains(&format!("sandgate-{id}")), "the crash left its table: {tables}");
    let groups = |id: &str| {
        ["pids", "cpu"].iter().any(|c| std::path::Path::new(&format!("/sys/fs/cgroup/{c}/sandgate-{id}")).exists())
    };
    assert!(groups(&id), "the crash left its cgroups");
    let mounted = |id: &str| std::fs::read_to_string("/proc/self/mounts").unwrap().contains(&format!("sandgate-{id}"));
    assert!(mounted(&id), "the crash left its workspace mounted");

    // The next start (here `sandgate reap`) removes everything the owner left.
    let out = sandgate(&["reap"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains(&format!("removed sandbox {id} (owner_died, was running)")), "{said}");
    let list = netns_list();
    assert!(!list.contains(&netns), "namespace left: {list}");
    assert!(!run(&["ip", "netns", "exec", &gateway.0, "nft", "list", "tables"]).contains("sandgate-"), "table left");
    assert!(!groups(&id), "cgroups left");
    assert!(!mounted(&id), "workspace still mounted");
    // Idempotent: a second pass finds nothing.
    let again = sandgate(&["reap"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandgate_run_injects_credentials_and_trusts_sandgate_ca() {
    if !privileged("sandgate_run_injects_credentials_and_trusts_sandgate_ca") {
        return;
    }
    const CANARY: &str = "ghp_CANARYrunCANARY0123456789abcdefAB";
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-runc");
    let pki = crate::support::pki::Pki::new();
    let seen: origin::Seen = Default::default();
    let listener = gateway.loopback_listener();
    let port = listener.local_addr().unwrap().port();
    let _o = origin::serve_recording(
        tokio::net::TcpListener::from_std(listener).unwrap(),
        "tls",
        Some(tokio_rustls::TlsAcceptor::from(pki.server_config(&["origin.test"]))),
        seen.clone(),
    );
    let b = super::intercept::Broker::new(&[("origin-token", CANARY)]);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "{}credentials:\n  - hosts: [origin.test]\n    secret: origin-token\n    username: x-access-token\n",
            loopback_policy(&[port])
        ),
    )
    .unwrap();
    let out = gateway
        .sandgate()
        .args(["run", "--policy"])
        .arg(&policy)
        .arg("--state")
        .arg(&state)
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .arg("--vault")
        .arg(b.vault())
        .arg("--vault-key-file")
        .arg(b.key())
        .arg("--upstream-ca")
        .arg(&pki.ca_path)
        .args([
            "--",
            "sh",
            "-c",
            &format!("env | grep -c SSL_CERT_FILE=/run/sandgate; curl -sS https://origin.test:{port}/repo"),
        ])
        .env_remove("SANDGATE_VAULT_KEY")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("origin tls GET /repo"), "the sandbox trusted Sandgate's leaf: {stdout}{stderr}");
    let auth = format!(
        "Basic {}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("x-access-token:{CANARY}"))
    );
    assert_eq!(*seen.lock().unwrap(), vec![auth], "the origin got the credential the sandbox never held");
    assert!(!stdout.contains(CANARY) && !stderr.contains(CANARY), "the canary leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_pauses_resumes_and_is_removed_with_its_work_kept() {
    if !privileged("a_sandbox_pauses_resumes_and_is_removed_with_its_work_kept") {
        return;
    }
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-pause");
    let workspace = tempfile::tempdir().unwrap();
    let sandgate = |args: &[&str]| {
        let out = Command::new(sandgate_bin()).args(args).arg("--state").arg(&state).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let mut owner = gateway
        .sandgate()
        .args(["run", "--state"])
        .arg(&state)
        .arg("--workspace")
        .arg(workspace.path())
        .args(["--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /workspace/n; sleep 0.05; done"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The sandbox shows as running; its counter lives in the mounted workspace image.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let id = loop {
        let (_, ls) = sandgate(&["sandbox", "ls"]);
        if let Some(line) = ls.lines().find(|l| l.contains(" running ")) {
            break line.split_whitespace().next().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "never running: {ls}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let counter = state.join("mnt").join(format!("sandgate-{id}")).join("n");
    let read = || std::fs::read_to_string(&counter).unwrap_or_default().trim().parse::<u64>().unwrap_or(0);
    std::thread::sleep(std::time::Duration::from_millis(300));

    assert_eq!(sandgate(&["sandbox", "pause", &id]).0, Some(0));
    let frozen = read();
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert_eq!(read(), frozen, "a paused sandbox kept running");
    assert!(sandgate(&["sandbox", "ls"]).1.contains(&format!("{id}   paused")));
    assert_ne!(sandgate(&["sandbox", "pause", &id]).0, Some(0), "pausing twice is an error");

    assert_eq!(sandgate(&["sandbox", "resume", &id]).0, Some(0));
    std::thread::sleep(std::time::Duration::from_millis(400));
    assert!(read() > frozen, "the same processes continue after resume");

    let (code, said) = sandgate(&["sandbox", "rm", &id]);
    assert_eq!(code, Some(0), "{said}");
    // The owner stopped the sandbox (its command was killed: 137) and exited.
    assert_eq!(owner.wait().unwrap().code(), Some(137));
    let (_, ls) = sandgate(&["sandbox", "ls"]);
    assert!(ls.contains(&format!("{id}   stopped   removed")), "{ls}");
    // The work survives: the next run on the same workspace reads the counter.
    let out = gateway
        .sandgate()
        .args(["run", "--state"])
        .arg(&state)
        .arg("--workspace")
        .arg(workspace.path())
        .args(["--", "cat", "/workspace/n"])
        .output()
        .unwrap();
    let kept: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    assert!(kept > frozen, "workspace lost: {kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_sandbox_runs_commands_until_removed() {
    if !privileged("a_created_sandbox_runs_commands_until_removed") {
        return;
    }
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-exec");
    let (o, dir, policy) = gateway.plain_origin();
    let port = o.addr.port();
    let ws = dir.path().join("ws");
    let sandgate = |args: &[&str]| {
        outcome(gateway.sandgate().arg("sandbox").arg("--state").arg(&state).args(args).output().unwrap())
    };
    let (code, id, err) = sandgate(&[
        "create",
        "--",
        "--policy",
        policy.to_str().unwrap(),
        "--workspace",
        ws.to_str().unwrap(),
        "--pids",
        "64",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let id = id.trim().to_owned();
    assert_eq!(id.len(), 6, "{id}");

    // Commands run inside the same sandbox: its PID namespace (bwrap is its PID 1), no
    // capabilities, the proxy variables, the workspace, and the policy on the way out.
    let (code, out, err) = sandgate(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!(
            "cat /proc/1/comm; grep CapEff /proc/self/status; echo exec > /workspace/e; curl -s http://origin.test:{port}/from-exec; exit 5"
        ),
    ]);
    assert_eq!(code, Some(5), "{out}{err}");
    assert!(out.starts_with("bwrap\n"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("origin plain GET /from-exec"), "{out}");
    let (_, out, _) = sandgate(&["exec", &id, "--", "cat", "/workspace/e"]);
    assert_eq!(out, "exec\n");
    let (code, _, _) = sandgate(&["exec", "nosuch", "--", "true"]);
    assert_eq!(code, Some(1));

    let (code, _, err) = sandgate(&["rm", &id]);
    assert_eq!(code, Some(0), "{err}");
    let (_, ls, _) = sandgate(&["ls"]);
    assert!(ls.contains(&format!("{id}   stopped   removed")), "{ls}");
    let (code, _, err) = sandgate(&["exec", &id, "--", "true"]);
    assert_eq!(code, Some(1), "exec into a removed sandbox: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandgate_run_under_gvisor() {
    if !privileged("sandgate_run_under_gvisor") {
        return;
    }
    let have_runsc = Command::new("runsc").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        have_runsc || std::env::var("SANDGATE_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "runsc is missing (scripts/setup installs it)"
    );
    if !have_runsc {
        eprintln!("SKIPPED sandgate_run_under_gvisor: needs runsc (apt-get install runsc)");
        return;
    }
    let (_lock, state) = exclusive_state();
    let gateway = Gateway::new("sg-gv");
    let (o, dir, policy) = gateway.plain_origin();
    let port = o.addr.port();
    let out = gateway
        .sandgate()
        .args(["run", "--isolation", "gvisor", "--policy"])
        .arg(&policy)
        .arg("--state")
        .arg(&state)
        .arg("--workspace")
        .arg(dir.path().join("ws"))
        .args([
            "--",
            "sh",
            "-c",
            &format!(
                "uname -r; grep CapEff /proc/self/status; curl -s http://origin.test:{port}/gvisor; curl -s --noproxy '*' --resolve evil.test:80:198.18.0.10 http://evil.test/; exit 9"
            ),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(9), "{stdout}{stderr}");
    assert!(stdout.starts_with("4.4.0"), "gVisor's kernel answers uname: {stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("origin plain GET /gvisor"), "the policy's allowed origin is reached: {stdout}{stderr}");
    assert!(stdout.contains("sandgate: denied evil.test:80"), "and the rest refused: {stdout}");
}
