//! The proxy under test: the real `sandgate` binary, started with a policy on port 0 (or in a
//! network namespace), its JSON connection log and its metrics read back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `sandgate` binary next to this test binary (`cargo test --workspace` builds it).
pub(crate) fn sandgate_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SANDGATE_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("sandgate");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build --bin sandgate`) or run the workspace tests",
        bin.display()
    );
    bin
}

/// Builds a proxy process.
pub(crate) struct ProxyBuilder {
    policy: String,
    args: Vec<String>,
    netns: Option<String>,
    transparent: Option<String>,
    listen: String,
    uid: Option<u32>,
}

/// A running proxy; killed when dropped.
pub(crate) struct ProxyProc {
    child: Child,
    pub(crate) explicit: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) sni: Vec<SocketAddr>,
    pub(crate) dns: Option<SocketAddr>,
    pub(crate) policy_path: PathBuf,
    netns: Option<String>,
    logs: Arc<Mutex<Vec<Value>>>,
    diag: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

pub(crate) fn new(policy: &str) -> ProxyBuilder {
    ProxyBuilder {
        policy: policy.to_owned(),
        args: Vec::new(),
        netns: None,
        transparent: None,
        listen: "127.0.0.1:0".into(),
        uid: None,
    }
}

impl ProxyBuilder {
    /// Adds command-line arguments.
    pub(crate) fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| (*s).to_owned()));
        self
    }

    /// Runs the proxy inside a network namespace (`ip netns exec`).
    pub(crate) fn netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_owned());
        self
    }

    /// Opens the explicit listener on `addr` instead of `127.0.0.1:0`.
    pub(crate) fn listen(mut self, addr: &str) -> Self {
        self.listen = addr.to_owned();
        self
    }

    /// Opens the transparent listener on `addr`.
    pub(crate) fn transparent(mut self, addr: &str) -> Self {
        self.transparent = Some(addr.to_owned());
        self
    }

    /// Runs the proxy as `uid` (root only; `setpriv`), as a sidecar proxy runs.
    pub(crate) fn uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }

    pub(crate) fn start(self) -> ProxyProc {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let policy_path = dir.path().join("policy.yaml");
        std::fs::write(&policy_path, &self.policy).unwrap();
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = &self.netns {
            argv.extend(["ip", "netns", "exec", ns].map(str::to_owned));
        }
        if let Some(uid) = self.uid {
            // The policy must be readable by that user.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let id = uid.to_string();
            argv.extend(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"].map(str::to_owned));
        }
        let mut cmd = match argv.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(sandgate_bin());
                c
            }
            None => Command::new(sandgate_bin()),
        };
        cmd.arg("proxy")
            .arg("--policy")
            .arg(&policy_path)
            .args(["--listen", &self.listen, "--admin", "127.0.0.1:0", "--policy-poll", "100ms"])
            .args(["--drain-timeout", "3s"]);
        match &self.transparent {
            Some(t) => cmd.args(["--transparent", t]),
            None => cmd.arg("--no-transparent"),
        };
        cmd.args(&self.args).env("SANDGATE_LOG", "info").stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let diag = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let l = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
                l.lock().unwrap().push(v);
            }
        });
        let stderr = child.stderr.take().unwrap();
        let d = diag.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                d.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut explicit, mut admin, mut sni, mut dns) = (None, None, Vec::new(), None);
        while explicit.is_none() || admin.is_none() {
            assert!(Instant::now() < deadline, "proxy did not start: {:?}", diag.lock().unwrap());
            if let Ok(Some(status)) = child.try_wait() {
                panic!("proxy exited with {status}: {:?}", diag.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
            for line in diag.lock().unwrap().iter() {
                let Some(addr) = line.split("addr=").nth(1).and_then(|a| a.trim().parse::<SocketAddr>().ok()) else {
                    continue;
                };
                if line.contains("listener=\"explicit\"") {
                    explicit = Some(addr);
                } else if line.contains("listener=\"admin\"") {
                    admin = Some(addr);
                } else if line.contains("listener=\"dns\"") {
                    dns = Some(addr);
                } else if line.contains("listener=\"sni\"") && !sni.contains(&addr) {
                    sni.push(addr);
                }
            }
        }
        ProxyProc {
            child,
            explicit: explicit.unwrap(),
            admin: admin.unwrap(),
            sni,
            dns,
            policy_path,
            netns: self.netns,
            logs,
            diag,
            _dir: dir,
        }
    }
}

impl ProxyProc {
    /// `http://127.0.0.1:PORT`, for curl's `-x`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.explicit)
    }

    /// Waits for a connection-log event matching `pred` (5 s at most).
    pub(crate) fn wait_log(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(v) = self.logs.lock().unwrap().iter().find(|v| pred(v)) {
                return v.clone();
            }
            assert!(Instant::now() < deadline, "no log event {what}; got {:#?}", self.logs.lock().unwrap());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the connection-log event whose `dst_host` is `host`.
    pub(crate) fn log_for(&self, host: &str) -> Value {
        self.wait_log(host, |v| v["dst_host"] == host)
    }

    /// Every connection-log event so far.
    pub(crate) fn logs(&self) -> Vec<Value> {
        self.logs.lock().unwrap().clone()
    }

    /// Diagnostic lines so far.
    pub(crate) fn diag(&self) -> Vec<String> {
        self.diag.lock().unwrap().clone()
    }

    /// The Prometheus text from `/metrics`.
    pub(crate) fn metrics(&self) -> String {
        match &self.netns {
            None => http_get(self.admin, "/metrics").1,
            Some(ns) => {
                let (ns, admin) = (ns.clone(), self.admin);
                std::thread::spawn(move || {
                    crate::support::netns::enter(&ns);
                    http_get(admin, "/metrics").1
                })
                .join()
                .unwrap()
            }
        }
    }

    /// The value of the sample `name` whose labels include every pair in `labels` (0 if none).
    pub(crate) fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Sends a signal (`TERM`, `HUP`) to the proxy.
    pub(crate) fn signal(&self, sig: &str) {
        let pid = self.pid();
        let ok = Command::new("kill").args([&format!("-{sig}"), &pid.to_string()]).status().unwrap().success();
        assert!(ok, "kill -{sig} {pid}");
    }

    /// The proxy's process id (the `sandgate` child of `ip netns exec` when in a namespace,
    /// which execs, so the same pid).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit and returns its status code.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal blocking HTTP/1.1 GET: (status, body).
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}
