//! The in-pod redirect that `sandgate init` installs when Sandgate runs as a Kubernetes sidecar:
//! the workload's outbound TCP goes to the sidecar's transparent port, its DNS to the sidecar's
//! DNS port, the proxy's own UID is exempt (so the proxy is not looped back to itself), any
//! other outbound packet of the workload is dropped, and nothing new reaches the pod from
//! outside except the proxy's admin port (the kubelet's probes).
//!
//! Two renderings of the same rules: nftables (one `inet sandgate-init` table, replaced in one
//! transaction) and iptables-legacy (chains `SANDGATE_*` in the `nat` and `filter` tables,
//! without `comment` or conntrack matches, which gVisor's netstack lacks). Both are idempotent:
//! applying them twice leaves the same ruleset.
//!
//! This is a boundary only against workloads that cannot become the proxy's UID or change the
//! pod's rules: the admission webhook refuses pods that could (see the README's threat model).

use std::fmt::Write;

use crate::attach::{AttachError, Run};

/// The UID the sidecar proxy runs as unless configured otherwise.
pub const DEFAULT_PROXY_UID: u32 = 4750;
/// The sidecar proxy's explicit listener port.
pub const DEFAULT_EXPLICIT_PORT: u16 = 4750;
/// The sidecar proxy's transparent listener port (where TCP is redirected).
pub const DEFAULT_TRANSPARENT_PORT: u16 = 4751;
/// The sidecar proxy's admin port (probes, metrics), left open for inbound connections.
pub const DEFAULT_ADMIN_PORT: u16 = 4752;
/// The sidecar proxy's DNS port (where DNS is redirected).
pub const DEFAULT_DNS_PORT: u16 = 4753;

/// The nftables table the sidecar's redirect lives in.
pub const INIT_TABLE: &str = "sandgate-init";
/// The iptables-legacy chains the redirect lives in: `(table, chain, jumped from)`.
pub const IPTABLES_CHAINS: [(&str, &str, &str); 3] = [
    ("nat", "SANDGATE_OUTPUT", "OUTPUT"),
    ("filter", "SANDGATE_OUTPUT", "OUTPUT"),
    ("filter", "SANDGATE_INPUT", "INPUT"),
];

/// What the redirect needs to know (ports are the sidecar's, on loopback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectConfig {
    /// The UID the proxy runs as: its traffic leaves the pod untouched.
    pub proxy_uid: u32,
    /// The proxy's transparent listener port.
    pub transparent_port: u16,
    /// The proxy's DNS port.
    pub dns_port: u16,
    /// Inbound TCP ports left open (the proxy's admin port, for the kubelet's probes).
    pub inbound_ports: Vec<u16>,
    /// The first ephemeral port (`ip_local_port_range`). iptables-legacy rules cannot use
    /// conntrack or TCP flags under gVisor, so they tell replies from new inbound connections
    /// by port: everything addressed below this port is dropped.
    pub ephemeral_start: u16,
}

/// The packet filter a redirect is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// nftables (`nft`): runc and Kata pods.
    Nftables,
    /// iptables-legacy (`iptables-legacy-restore`): the only interface gVisor emulates.
    IptablesLegacy,
}

// === impl RedirectConfig ===

impl RedirectConfig {
    /// The nftables ruleset, for `nft -f`: deletes and recreates the table in one transaction.
    pub fn nft(&self) -> String {
        let (uid, t, d) = (self.proxy_uid, self.transparent_port, self.dns_port);
        let inbound = match self.inbound_ports.as_slice() {
            [] => String::new(),
            ports => {
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                format!("\t\ttcp dport {{ {} }} accept comment \"the proxy's probes\"\n", list.join(", "))
            }
        };
        let mut s = String::with_capacity(1024);
        let _ = write!(
            s,
            "add table inet {INIT_TABLE}
delete table inet {INIT_TABLE}
table inet {INIT_TABLE} {{
\tchain output_nat {{
\t\ttype nat hook output priority -100; policy accept;
\t\tmeta skuid {uid} return comment \"the proxy itself\"
\t\toifname \"lo\" return
\t\tmeta nfproto ipv4 udp dport 53 redirect to :{d} comment \"DNS only to Sandgate\"
\t\tmeta nfproto ipv4 meta l4proto tcp redirect to :{t} comment \"all TCP to the proxy\"
\t}}
\tchain output {{
\t\ttype filter hook output priority filter; policy accept;
\t\tmeta skuid {uid} accept
\t\toifname \"lo\" accept
\t\tip daddr 127.0.0.0/8 accept comment \"redirected: NAT does not change the output interface seen here\"
\t\tcounter drop comment \"anything the redirect did not take (UDP, ICMP, IPv6)\"
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname \"lo\" accept
\t\tct state established,related accept
{inbound}\t\tcounter drop comment \"nothing reaches into the pod\"
\t}}
}}
"
        );
        s
    }

    /// The iptables-legacy rules, for `iptables-legacy-restore --noflush`: declaring a chain
    /// that exists flushes it, so the chains are rewritten whole and other chains untouched.
    /// The jumps into them are added separately, only when missing ([`apply`] does both).
    pub fn iptables(&self) -> String {
        let (uid, t, d) = (self.proxy_uid, self.transparent_port, self.dns_port);
        let mut s = String::with_capacity(1024);
        let _ = write!(
            s,
            "*nat
:SANDGATE_OUTPUT - [0:0]
-A SANDGATE_OUTPUT -m owner --uid-owner {uid} -j RETURN
-A SANDGATE_OUTPUT -o lo -j RETURN
-A SANDGATE_OUTPUT -p udp -m udp --dport 53 -j REDIRECT --to-ports {d}
-A SANDGATE_OUTPUT -p tcp -j REDIRECT --to-ports {t}
COMMIT
*filter
:SANDGATE_OUTPUT - [0:0]
:SANDGATE_INPUT - [0:0]
-A SANDGATE_OUTPUT -m owner --uid-owner {uid} -j RETURN
-A SANDGATE_OUTPUT -o lo -j RETURN
-A SANDGATE_OUTPUT -d 127.0.0.0/8 -j RETURN
-A SANDGATE_OUTPUT -j DROP
-A SANDGATE_INPUT -i lo -j RETURN
"
        );
        for p in &self.inbound_ports {
            let _ = writeln!(s, "-A SANDGATE_INPUT -p tcp -m tcp --dport {p} -j RETURN");
        }
        // gVisor has neither conntrack nor TCP-flag matches: replies to the proxy's own
        // connections arrive on ephemeral ports, anything else inbound is dropped.
        let below = self.ephemeral_start.saturating_sub(1);
        let _ = writeln!(s, "-A SANDGATE_INPUT -p tcp -m tcp --dport 0:{below} -j DROP");
        let _ = writeln!(s, "-A SANDGATE_INPUT -p udp -m udp --dport 0:{below} -j DROP");
        s.push_str("COMMIT\n");
        s
    }
}

/// Installs the redirect with `backend`, idempotently: a second run leaves the same rules.
pub fn apply(run: &mut impl Run, config: &RedirectConfig, backend: Backend) -> Result<(), AttachError> {
    match backend {
        Backend::Nftables => {
            run.run("nft", &["-f", "-"], Some(&config.nft()))?;
        }
        Backend::IptablesLegacy => {
            run.run("iptables-legacy-restore", &["-w", "5", "--noflush"], Some(&config.iptables()))?;
            for (table, chain, from) in IPTABLES_CHAINS {
                let jump = ["-w", "5", "-t", table, "-C", from, "-j", chain];
                if run.run("iptables-legacy", &jump, None).is_err() {
                    run.run("iptables-legacy", &["-w", "5", "-t", table, "-I", from, "1", "-j", chain], None)?;
                }
            }
        }
    }
    Ok(())
}

/// An address no network routes (RFC 2544 benchmarking range): the probe's destination.
const PROBE: std::net::SocketAddr =
    std::net::SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(198, 18, 0, 1), 9));

/// Why the redirect did not prove itself.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The probe listener could not take the transparent port.
    #[error("cannot listen on 127.0.0.1:{port} for the probe (is something already there?): {source}")]
    Listen {
        /// The transparent port.
        port: u16,
        /// Why.
        source: std::io::Error,
    },
    /// A connection to an outside address was not redirected to the transparent port.
    #[error(
        "a connection to {PROBE} was not redirected to 127.0.0.1:{port} ({why}): outbound traffic would bypass the proxy"
    )]
    NotRedirected {
        /// The transparent port.
        port: u16,
        /// What happened instead.
        why: String,
    },
}

/// Proves the redirect works before any other container starts (the idea of Istio's
/// validation init container): listens on the transparent port, connects to an address that
/// exists nowhere, and requires that connection to arrive on the listener. Must run as a UID
/// other than the proxy's, before the proxy starts.
pub fn verify(transparent_port: u16) -> Result<(), VerifyError> {
    use std::time::{Duration, Instant};
    let port = transparent_port;
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|source| VerifyError::Listen { port, source })?;
    let not = |why: String| VerifyError::NotRedirected { port, why };
    let client =
        std::net::TcpStream::connect_timeout(&PROBE, Duration::from_secs(2)).map_err(|e| not(e.to_string()))?;
    listener.set_nonblocking(true).map_err(|e| not(e.to_string()))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    let mine = client.local_addr().map_err(|e| not(e.to_string()))?;
    loop {
        match listener.accept() {
            // The accepted peer is the probe's own socket: the redirect took it.
            Ok((_, peer)) if peer == mine => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(not(format!("nothing arrived: {e}"))),
        }
    }
}

/// The backend this pod can use: nftables when `nft` can list tables, else iptables-legacy
/// (gVisor refuses nftables with "Protocol not supported").
pub fn detect(run: &mut impl Run) -> Backend {
    if run.run("nft", &["list", "tables"], None).is_ok() { Backend::Nftables } else { Backend::IptablesLegacy }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RedirectConfig {
        RedirectConfig {
            proxy_uid: 4750,
            transparent_port: 4751,
            dns_port: 4753,
            inbound_ports: vec![4752],
            ephemeral_start: 32768,
        }
    }

    fn golden(name: &str, text: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        if std::env::var_os("SANDGATE_BLESS").is_some() {
            std::fs::write(&path, text).unwrap();
        }
        assert_eq!(text, std::fs::read_to_string(path).unwrap());
    }

    #[test]
    fn renderings_match_the_golden_files() {
        golden("init.nft", &config().nft());
        golden("init.iptables", &config().iptables());
    }

    #[test]
    fn iptables_rules_use_only_what_gvisor_emulates() {
        let rules = config().iptables();
        // gVisor's tcp matcher refuses any flag match (`--syn`, `--tcp-flags`): "unsupported
        // TCP matcher flags set" (pkg/sentry/socket/netfilter/tcp_matcher.go).
        for unsupported in ["comment", "--state", "conntrack", "MASQUERADE", "--syn", "--tcp-flags", "--ctstate"] {
            assert!(!rules.contains(unsupported), "{unsupported} in {rules}");
        }
    }

    /// Records commands; `-C` (check) fails the first time, as on a fresh pod.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<String>,
        jumps: Vec<String>,
    }

    impl Run for Recorder {
        fn run(&mut self, program: &str, args: &[&str], _stdin: Option<&str>) -> Result<String, AttachError> {
            let line = format!("{program} {}", args.join(" "));
            self.calls.push(line.clone());
            if args.contains(&"-C") {
                let key = line.replace(" -C ", " ");
                if !self.jumps.contains(&key) {
                    return Err(AttachError::Command { command: line, stderr: "Bad rule".into() });
                }
            }
            if args.contains(&"-I") {
                self.jumps.push(line.replace(" -I ", " ").replace(" 1 -j", " -j"));
            }
            Ok(String::new())
        }
    }

    #[test]
    fn iptables_jumps_are_added_once() {
        let mut r = Recorder::default();
        apply(&mut r, &config(), Backend::IptablesLegacy).unwrap();
        apply(&mut r, &config(), Backend::IptablesLegacy).unwrap();
        let inserts = r.calls.iter().filter(|c| c.contains(" -I ")).count();
        assert_eq!(inserts, 3, "{:#?}", r.calls);
    }
}
