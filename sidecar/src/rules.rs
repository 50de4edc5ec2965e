//! The gateway-side nftables ruleset, rendered as text from data. One `sandgate` table holds
//! everything and matches only Sandgate's interfaces (a named set), so it never touches other
//! traffic of the host; each sandbox adds one element per set.
//!
//! What it enforces, per sandbox interface:
//! - every TCP connection is redirected to the proxy's transparent listener (the redirect on the
//!   gateway side keeps the original destination readable by `SO_ORIGINAL_DST`);
//! - DNS (UDP and TCP 53) is redirected to Sandgate's DNS port, so no other resolver is reached;
//! - a packet whose source is not the sandbox's own address is dropped (no spoofing);
//! - everything else addressed to the gateway (UDP, ICMP, other ports, host services) is dropped;
//! - nothing from a sandbox is forwarded anywhere (not out, not to another sandbox), and no
//!   connection from the host or another sandbox reaches into one;
//! - IPv6 from a sandbox is dropped (Sandgate serves sandboxes over IPv4).

use std::fmt::Write;
use std::net::Ipv4Addr;

/// The name of Sandgate's nftables table (family `inet`).
pub const TABLE: &str = "sandgate";

/// What the ruleset needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachConfig {
    /// The table's name: [`TABLE`] for a gateway that serves many sandboxes from one ruleset,
    /// or `sandgate-<id>` for one sandbox's own table (removed with it).
    pub table: String,
    /// The proxy's transparent listener port on the gateway.
    pub transparent_port: u16,
    /// Sandgate's DNS port on the gateway.
    pub dns_port: u16,
    /// The explicit proxy's port on the gateway address, for `HTTPS_PROXY` in the sandbox.
    pub explicit_port: Option<u16>,
    /// The sandboxes attached to this gateway.
    pub links: Vec<SandboxLink>,
}

/// One sandbox's link to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLink {
    /// The gateway-side interface name (at most 15 bytes).
    pub gateway_if: String,
    /// The gateway's address on the link.
    pub gateway_addr: Ipv4Addr,
    /// The sandbox's address, the only source accepted from it.
    pub sandbox_addr: Ipv4Addr,
}

// === impl AttachConfig ===

impl AttachConfig {
    /// The whole ruleset, for `nft -f`: it deletes and recreates the `sandgate` table in one
    /// transaction, so applying it twice gives the same state (idempotent).
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(2048);
        // `add` then `delete` makes the delete succeed whether or not the table exists.
        let table = &self.table;
        let _ = writeln!(s, "add table inet {table}");
        let _ = writeln!(s, "delete table inet {table}");
        let _ = writeln!(s, "table inet {table} {{");
        let ifs: Vec<String> = self.links.iter().map(|l| format!("\"{}\"", l.gateway_if)).collect();
        let pairs: Vec<String> =
            self.links.iter().map(|l| format!("\"{}\" . {}", l.gateway_if, l.sandbox_addr)).collect();
        let gws: Vec<String> =
            self.links.iter().map(|l| format!("\"{}\" . {}", l.gateway_if, l.gateway_addr)).collect();
        set(&mut s, "sandbox_ifs", "ifname", &ifs);
        set(&mut s, "sandbox_sources", "ifname . ipv4_addr", &pairs);
        set(&mut s, "sandbox_gateways", "ifname . ipv4_addr", &gws);
        let (t, d) = (self.transparent_port, self.dns_port);
        let explicit = match self.explicit_port {
            Some(e) => {
                format!("\t\tiifname . ip daddr @sandbox_gateways tcp dport {e} accept comment \"explicit proxy\"\n")
            }
            None => String::new(),
        };
        let _ = write!(
            s,
            "\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname @sandbox_ifs meta nfproto ipv4 meta l4proto {{ tcp, udp }} th dport 53 redirect to :{d} comment \"DNS only to Sandgate\"
\t\tiifname @sandbox_ifs iifname . ip daddr != @sandbox_gateways meta l4proto tcp redirect to :{t} comment \"all TCP to the proxy\"
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname != @sandbox_ifs accept
\t\tmeta nfproto ipv6 drop comment \"no IPv6 from sandboxes\"
\t\tiifname . ip saddr != @sandbox_sources counter drop comment \"spoofed source\"
\t\tct state established,related accept
\t\tct status dnat tcp dport {t} accept comment \"redirected TCP\"
\t\tct status dnat meta l4proto {{ tcp, udp }} th dport {d} accept comment \"redirected DNS\"
{explicit}\t\tcounter drop comment \"everything else to the gateway\"
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname @sandbox_ifs counter drop comment \"never forward from a sandbox\"
\t\toifname @sandbox_ifs counter drop comment \"nothing reaches into a sandbox\"
\t}}
\tchain output {{
\t\ttype filter hook output priority filter; policy accept;
\t\toifname @sandbox_ifs ct state established,related accept
\t\toifname @sandbox_ifs counter drop comment \"no new connection into a sandbox\"
\t}}
}}
"
        );
        s
    }
}

fn set(s: &mut String, name: &str, ty: &str, elements: &[String]) {
    let _ = write!(s, "\tset {name} {{\n\t\ttype {ty}\n");
    if !elements.is_empty() {
        let _ = writeln!(s, "\t\telements = {{ {} }}", elements.join(", "));
    }
    let _ = writeln!(s, "\t}}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_matches_the_golden_file() {
        let config = AttachConfig {
            table: TABLE.to_owned(),
            transparent_port: 4751,
            dns_port: 4753,
            explicit_port: Some(4750),
            links: vec![
                SandboxLink {
                    gateway_if: "sgg-a1".into(),
                    gateway_addr: Ipv4Addr::new(10, 213, 0, 1),
                    sandbox_addr: Ipv4Addr::new(10, 213, 0, 2),
                },
                SandboxLink {
                    gateway_if: "sgg-b2".into(),
                    gateway_addr: Ipv4Addr::new(10, 213, 0, 5),
                    sandbox_addr: Ipv4Addr::new(10, 213, 0, 6),
                },
            ],
        };
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-sandboxes.nft");
        if std::env::var_os("SANDGATE_BLESS").is_some() {
            std::fs::write(&golden, config.render()).unwrap();
        }
        assert_eq!(config.render(), std::fs::read_to_string(golden).unwrap());
    }
}
