//! Network namespaces for privileged tests: a sandbox namespace whose only way out is a veth
//! to a gateway namespace, where nftables redirects its TCP to the proxy. The machine's root
//! namespace is never touched. Everything is removed on drop.

use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this process may create namespaces and nftables rules. Without privileges the test
/// is skipped with a message, except under `SANDGATE_REQUIRE_PRIVILEGED=1` (CI), where it fails.
pub(crate) fn privileged(test: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    let tools = ["ip", "nft"].iter().all(|t| Command::new(t).arg("-V").output().is_ok_and(|o| o.status.success()));
    if root && tools {
        return true;
    }
    let why = if root { "needs `ip` and `nft` (apt-get install iproute2 nftables)" } else { "needs root" };
    assert!(
        std::env::var("SANDGATE_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "{test}: {why}, and SANDGATE_REQUIRE_PRIVILEGED=1"
    );
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// Runs a command, panicking with its output if it fails.
pub(crate) fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A sandbox namespace behind a gateway namespace.
pub(crate) struct Topology {
    /// The sandbox's namespace.
    pub(crate) sbx: String,
    /// The gateway's namespace, where the proxy runs.
    pub(crate) gw: String,
    /// The gateway-side veth.
    pub(crate) gw_if: String,
}

/// The gateway's address on the link; the sandbox is `.2`.
pub(crate) const GW_IP: &str = "10.213.0.1";
/// The sandbox's address.
pub(crate) const SBX_IP: &str = "10.213.0.2";
/// The gateway's IPv6 address on the link; the sandbox is `::2`.
pub(crate) const GW_IP6: &str = "fd00:213::1";
/// The sandbox's IPv6 address.
pub(crate) const SBX_IP6: &str = "fd00:213::2";

impl Topology {
    /// Creates both namespaces and the veth between them; the sandbox routes everything via the
    /// gateway, which has no other interface, so nothing can leave the machine.
    pub(crate) fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let tag = format!("{:x}{:x}", std::process::id() & 0xffff, N.fetch_add(1, Ordering::Relaxed));
        let t = Self { sbx: format!("sg-sbx-{tag}"), gw: format!("sg-gw-{tag}"), gw_if: format!("sgg{tag}") };
        let sbx_if = format!("sgs{tag}");
        run(&["ip", "netns", "add", &t.sbx]);
        run(&["ip", "netns", "add", &t.gw]);
        run(&["ip", "link", "add", &sbx_if, "netns", &t.sbx, "type", "veth", "peer", "name", &t.gw_if, "netns", &t.gw]);
        run(&["ip", "-n", &t.sbx, "addr", "add", &format!("{SBX_IP}/30"), "dev", &sbx_if]);
        run(&["ip", "-n", &t.gw, "addr", "add", &format!("{GW_IP}/30"), "dev", &t.gw_if]);
        for (ns, dev) in [(&t.sbx, &sbx_if), (&t.gw, &t.gw_if)] {
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        // nodad: the addresses are usable at once instead of after duplicate detection.
        run(&["ip", "-n", &t.sbx, "addr", "add", &format!("{SBX_IP6}/64"), "dev", &sbx_if, "nodad"]);
        run(&["ip", "-n", &t.gw, "addr", "add", &format!("{GW_IP6}/64"), "dev", &t.gw_if, "nodad"]);
        run(&["ip", "-n", &t.sbx, "route", "add", "default", "via", GW_IP]);
        run(&["ip", "-n", &t.sbx, "-6", "route", "add", "default", "via", GW_IP6]);
        t
    }

    /// Loads an nftables ruleset into the gateway namespace.
    pub(crate) fn gw_nft(&self, ruleset: &str) {
        let path = std::env::temp_dir().join(format!("{}.nft", self.gw));
        std::fs::write(&path, ruleset).unwrap();
        run(&["ip", "netns", "exec", &self.gw, "nft", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(path);
    }

    /// Runs a command inside the sandbox namespace and returns its output.
    pub(crate) fn in_sbx(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip").args(["netns", "exec", &self.sbx]).args(args).output().unwrap()
    }

    /// Binds a TCP listener inside the gateway namespace (from a thread that enters it).
    pub(crate) fn bind_in_gw(&self, addr: &str) -> std::net::TcpListener {
        let ns = self.gw.clone();
        let addr = addr.to_owned();
        std::thread::spawn(move || {
            enter(&ns);
            let l = std::net::TcpListener::bind(addr).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        })
        .join()
        .unwrap()
    }
}

/// Runs `f` on a thread of its own inside the network namespace `ns` and returns its result:
/// sockets made there belong to that namespace.
pub(crate) fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter(&ns);
        f()
    })
    .join()
    .unwrap()
}

/// Moves the calling thread into the named network namespace (for good: use a thread of
/// its own). Sockets it creates stay in that namespace whichever thread uses them later.
pub(crate) fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    rustix::thread::move_into_link_name_space(f.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network)).unwrap();
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Deleting a namespace removes its veth end, routes, rules and conntrack entries.
        let _ = Command::new("ip").args(["netns", "del", &self.sbx]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.gw]).status();
    }
}
