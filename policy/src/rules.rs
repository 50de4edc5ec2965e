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
    /// Credential rules, in document order.
    pub credentials: Vec<Credential>,
    /// Git repository rules, in document order.
    pub git: Vec<GitRule>,
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

/// A credential rule: requests to these hosts (optionally under a path prefix) are
/// intercepted and get the named vault secret added by the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// The rule's name (its `name:`, or its place such as `credentials[0]`).
    pub name: String,
    /// The hosts it applies to.
    pub hosts: Vec<HostPattern>,
    /// The vault secret's name (never its value).
    pub secret: String,
    /// How the secret goes on the request.
    pub apply: Apply,
    /// Only requests whose path starts with this get the credential.
    pub path_prefix: Option<String>,
    /// A value the sandbox may hold instead of the secret; swapped on these hosts only, refused
    /// anywhere else.
    pub placeholder: Option<String>,
}

/// How a credential is written on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Apply {
    /// `Authorization: Basic base64(username:secret)` (git hosts).
    Basic {
        /// The user name, e.g. `x-access-token` for GitHub.
        username: String,
    },
    /// `Authorization: Bearer secret`.
    Bearer,
    /// A named header carrying the secret as is.
    Header {
        /// The header's name.
        name: String,
    },
}

/// Repository scoping of git smart HTTP on intercepted hosts: which `owner/repo` may be
/// fetched and which pushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRule {
    /// The git hosts it applies to.
    pub hosts: Vec<HostPattern>,
    /// `owner/repo` globs that may be cloned or fetched.
    pub fetch: Vec<String>,
    /// `owner/repo` globs that may be pushed to.
    pub push: Vec<String>,
}
