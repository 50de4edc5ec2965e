//! The validated, normalised policy: typed rules and profiles, before indexing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::decision::Mode;
use crate::host::{HostName, HostPattern};

/// Ports an allow rule covers when it names none: HTTPS and HTTP.
pub const DEFAULT_ALLOW_PORTS: [u16; 2] = [443, 80];

/// A validated policy document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The document's name (a path, or `<embedded default>`).
    pub origin: String,
    /// The default profile (the document's top level), then the named ones in name order.
    pub profiles: Vec<Profile>,
    /// Static name-to-address entries, consulted before DNS.
    pub resolve: BTreeMap<HostName, Vec<IpAddr>>,
    /// Refuse any ClientHello that carries Encrypted Client Hello.
    pub refuse_ech: bool,
}

/// A set of rules and the clients it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// `default`, or the key under `profiles:`.
    pub name: String,
    /// Enforce or report.
    pub mode: Mode,
    /// Client source networks that select it (empty: any source).
    pub sources: Vec<IpNet>,
    /// Proxy-Authorization users (sandbox ids) that select it (empty: any user).
    pub users: Vec<String>,
    /// Allow rules in document order.
    pub allow: Vec<Rule>,
    /// Deny rules in document order.
    pub deny: Vec<Rule>,
}

/// One allow or deny rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Its name: the `name:` field, or its place such as `profiles.ci.allow[2]`.
    pub name: String,
    /// What it matches.
    pub target: RuleTarget,
    /// Which destination ports it covers.
    pub ports: Ports,
}

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleTarget {
    /// Host names.
    Hosts(Vec<HostPattern>),
    /// Address ranges.
    Cidrs(Vec<IpNet>),
}

/// The destination ports a rule covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// Every port (deny rules without `ports:`).
    Any,
    /// These ports.
    List(Box<[u16]>),
}

// === impl Ports ===

impl Ports {
    /// Whether `port` is covered.
    pub fn contains(&self, port: u16) -> bool {
        match self {
            Self::Any => true,
            Self::List(list) => list.contains(&port),
        }
    }
}
