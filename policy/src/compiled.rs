//! The compiled policy: indexes built once per load, shared as `Arc<CompiledPolicy>`, and the
//! decision functions the proxy calls per connection. Nothing here allocates per decision.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::credential::{CompiledCredential, CompiledGitRule};
use crate::decision::{Decision, Mode, Permit, ProfileId, Reason, RuleId, Verdict};
use crate::host::{Host, HostName, HostPattern};
use crate::net::classify;
use crate::rules::{Policy, Ports, RuleTarget};

/// A policy ready to decide: one per load, immutable, shared by every connection.
#[derive(Debug)]
pub struct CompiledPolicy {
    origin: String,
    profiles: Vec<CompiledProfile>,
    rule_names: Vec<Box<str>>,
    resolve: HashMap<HostName, Box<[IpAddr]>>,
    refuse_ech: bool,
    credentials: Vec<CompiledCredential>,
    git: Vec<CompiledGitRule>,
}

#[derive(Debug)]
struct CompiledProfile {
    name: Box<str>,
    mode: Mode,
    sources: Vec<IpNet>,
    users: Vec<Box<str>>,
    allow_hosts: HostIndex,
    deny_hosts: HostIndex,
    allow_cidrs: Vec<CidrEntry>,
    deny_cidrs: Vec<CidrEntry>,
}

/// Host rules indexed by the name they are anchored on. A lookup walks the host's suffixes
/// longest first, so the first hit is the most specific rule.
#[derive(Debug, Default)]
struct HostIndex {
    exact: HashMap<Box<str>, Vec<(RuleId, Ports)>>,
    subdomains: HashMap<Box<str>, Vec<(RuleId, Ports)>>,
}

#[derive(Debug)]
struct CidrEntry {
    net: IpNet,
    rule: RuleId,
    ports: Ports,
}

enum HostHit {
    Allowed(RuleId),
    WrongPort(RuleId),
    None,
}

// === impl CompiledPolicy ===

impl CompiledPolicy {
    /// Parses, validates and compiles a policy document.
    pub fn from_yaml(origin: &str, src: &str) -> Result<Self, crate::PolicyError> {
        crate::parse::parse(origin, src).map(Self::compile)
    }

    /// Builds the indexes of a validated policy.
    pub fn compile(policy: Policy) -> Self {
        let mut rule_names = Vec::new();
        let mut profiles = Vec::with_capacity(policy.profiles.len());
        for p in policy.profiles {
            let mut cp = CompiledProfile {
                name: p.name.into_boxed_str(),
                mode: p.mode,
                sources: p.sources,
                users: p.users.into_iter().map(String::into_boxed_str).collect(),
                allow_hosts: HostIndex::default(),
                deny_hosts: HostIndex::default(),
                allow_cidrs: Vec::new(),
                deny_cidrs: Vec::new(),
            };
            for (rules, deny) in [(p.allow, false), (p.deny, true)] {
                for rule in rules {
                    let id = RuleId(u32::try_from(rule_names.len()).unwrap_or(u32::MAX));
                    rule_names.push(rule.name.into_boxed_str());
                    let (hosts, cidrs) = if deny {
                        (&mut cp.deny_hosts, &mut cp.deny_cidrs)
                    } else {
                        (&mut cp.allow_hosts, &mut cp.allow_cidrs)
                    };
                    match rule.target {
                        RuleTarget::Hosts(patterns) => {
                            for pattern in patterns {
                                hosts.insert(&pattern, id, &rule.ports);
                            }
                        }
                        RuleTarget::Cidrs(nets) => {
                            cidrs.extend(nets.into_iter().map(|net| CidrEntry {
                                net,
                                rule: id,
                                ports: rule.ports.clone(),
                            }));
                        }
                    }
                }
            }
            // Most specific network first, so the reported rule is the narrowest that matched.
            cp.allow_cidrs.sort_by_key(|c| std::cmp::Reverse(c.net.prefix_len()));
            cp.deny_cidrs.sort_by_key(|c| std::cmp::Reverse(c.net.prefix_len()));
            profiles.push(cp);
        }
        let resolve = policy.resolve.into_iter().map(|(k, v)| (k, v.into_boxed_slice())).collect();
        // Patterns were checked when parsed, so a rule that fails to compile here is dropped
        // rather than allowed to panic.
        let git = policy.git.iter().filter_map(|g| CompiledGitRule::new(g).ok()).collect();
        let credentials = policy.credentials.into_iter().map(CompiledCredential::new).collect();
        Self { origin: policy.origin, profiles, rule_names, resolve, refuse_ech: policy.refuse_ech, credentials, git }
    }

    /// Number of profiles (the default one included).
    pub(crate) fn profile_count(&self) -> usize {
        self.profiles.len()
    }

    /// Every credential rule, in document order (to load their secrets, and to find
    /// placeholders sent where they do not belong).
    pub fn credentials(&self) -> &[CompiledCredential] {
        &self.credentials
    }

    /// The credential for a request to `host` with `path`: the first rule that covers both.
    pub fn credential_for(&self, host: &HostName, path: &str) -> Option<&CompiledCredential> {
        self.credentials.iter().find(|c| c.covers(host, path))
    }

    /// The git rule for `host`, if any.
    pub fn git_rule_for(&self, host: &HostName) -> Option<&CompiledGitRule> {
        self.git.iter().find(|g| g.covers_host(host))
    }

    /// Whether any host is intercepted (the proxy then needs its CA and the vault).
    pub fn needs_interception(&self) -> bool {
        !self.credentials.is_empty() || !self.git.is_empty()
    }

    /// Whether connections to `host` are intercepted (TLS terminated by Sandgate): only hosts
    /// that a credential rule or a git rule names. Every other host stays an opaque tunnel.
    pub fn intercepts(&self, host: &HostName) -> bool {
        self.credentials.iter().any(|c| c.covers_host(host)) || self.git_rule_for(host).is_some()
    }

    /// Where this policy came from (a path, or `<embedded default>`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The name of a profile.
    pub fn profile_name(&self, id: ProfileId) -> &str {
        self.profiles.get(usize::from(id.0)).map_or("default", |p| &p.name)
    }

    /// The name of a rule (its `name:`, or its place in the document).
    pub fn rule_name(&self, id: RuleId) -> &str {
        self.rule_names.get(id.0 as usize).map_or("", |n| n)
    }

    /// The id of the profile named `name`, if the policy has one.
    pub fn profile_id(&self, name: &str) -> Option<ProfileId> {
        self.profiles.iter().position(|p| &*p.name == name).and_then(|i| u16::try_from(i).ok()).map(ProfileId)
    }

    /// The names of every profile, default first (a closed set, for metric labels).
    pub fn profile_names(&self) -> impl Iterator<Item = &str> {
        self.profiles.iter().map(|p| &*p.name)
    }

    /// Whether ClientHellos carrying Encrypted Client Hello are refused.
    pub fn refuses_ech(&self) -> bool {
        self.refuse_ech
    }

    /// Static addresses for a name, from the policy's `resolve:` section.
    pub fn static_addrs(&self, name: &HostName) -> Option<&[IpAddr]> {
        self.resolve.get(name).map(|a| &**a)
    }

    /// Selects the profile for a client: among named profiles whose every `match` condition
    /// holds (user, when the profile lists users; source, when it lists sources), the one
    /// matched by user wins, then the longest source prefix; otherwise the default profile.
    /// A user is what the client claims, so a profile that must not be claimable by another
    /// sandbox should list `sources:` too.
    pub fn select_profile(&self, client: IpAddr, user: Option<&str>) -> ProfileId {
        let mut best: Option<(usize, (bool, u8))> = None;
        for (i, p) in self.profiles.iter().enumerate().skip(1) {
            let user_hit = match (p.users.is_empty(), user) {
                (true, _) => false,
                (false, Some(u)) if p.users.iter().any(|x| &**x == u) => true,
                (false, _) => continue,
            };
            let prefix = if p.sources.is_empty() {
                0
            } else {
                match p.sources.iter().filter(|n| n.contains(&client)).map(IpNet::prefix_len).max() {
                    Some(len) => len,
                    None => continue,
                }
            };
            let score = (user_hit, prefix);
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((i, score));
            }
        }
        ProfileId(best.map_or(0, |(i, _)| u16::try_from(i).unwrap_or(0)))
    }

    fn profile(&self, id: ProfileId) -> &CompiledProfile {
        // Ids come from this policy; fall back to the default profile rather than panic.
        self.profiles.get(usize::from(id.0)).unwrap_or(&self.profiles[0])
    }

    /// Decides a destination named by a client, before any name is resolved.
    pub fn decide(&self, profile: ProfileId, host: &Host, port: u16) -> Decision {
        let p = self.profile(profile);
        let (allowed, reason, rule) = match host {
            Host::Ip(ip) => {
                if let Some(c) = p.deny_cidrs.iter().find(|c| c.net.contains(ip) && c.ports.contains(port)) {
                    (false, Reason::CidrDenied, Some(c.rule))
                } else if let Some(c) = p.allow_cidrs.iter().find(|c| c.net.contains(ip) && c.ports.contains(port)) {
                    (true, Reason::CidrAllowed, Some(c.rule))
                } else if let Some(c) = p.allow_cidrs.iter().find(|c| c.net.contains(ip)) {
                    (false, Reason::PortNotAllowed, Some(c.rule))
                } else {
                    (false, Reason::IpNotAllowed, None)
                }
            }
            Host::Name(name) => {
                if let HostHit::Allowed(rule) = p.deny_hosts.lookup(name, port) {
                    (false, Reason::HostDenied, Some(rule))
                } else {
                    match p.allow_hosts.lookup(name, port) {
                        HostHit::Allowed(rule) => (true, Reason::HostAllowed, Some(rule)),
                        HostHit::WrongPort(rule) => (false, Reason::PortNotAllowed, Some(rule)),
                        HostHit::None => (false, Reason::HostNotAllowed, None),
                    }
                }
            }
        };
        p.decision(profile, allowed, reason, rule)
    }

    /// A decision for a refusal the proxy found in the protocol (SNI mismatch, ECH), under the
    /// profile's mode.
    pub fn refuse(&self, profile: ProfileId, reason: Reason) -> Decision {
        self.profile(profile).decision(profile, false, reason, None)
    }

    /// Checks resolved addresses against the profile: CIDR deny rules, then the address
    /// classes, which only a CIDR allow rule can open. Returns a `Permit` for the first address
    /// that passes, or the denial for the first that does not. In report mode the first address
    /// is permitted either way, with the verdict `report` if it would have been refused.
    pub fn vet(&self, decision: &Decision, addrs: &[IpAddr], port: u16) -> Result<Permit, Decision> {
        let p = self.profile(decision.profile);
        if decision.verdict == Verdict::Deny {
            return Err(*decision);
        }
        let mut first_refusal = None;
        for &ip in addrs {
            let refusal = if let Some(c) = p.deny_cidrs.iter().find(|c| c.net.contains(&ip) && c.ports.contains(port)) {
                Some((Reason::CidrDenied, Some(c.rule)))
            } else if p.allow_cidrs.iter().any(|c| c.net.contains(&ip) && c.ports.contains(port)) {
                None
            } else {
                let class = classify(ip);
                (!class.is_public()).then_some((Reason::Address(class), decision.rule))
            };
            match refusal {
                None => return Ok(Permit { decision: *decision, upstream: SocketAddr::new(ip, port) }),
                Some(r) => {
                    if first_refusal.is_none() {
                        first_refusal = Some((ip, r));
                    }
                }
            }
        }
        let (ip, (reason, rule)) = match first_refusal {
            Some(r) => r,
            None => return Err(p.decision(decision.profile, false, Reason::Unresolvable, decision.rule)),
        };
        // A host already reported keeps its first reason; the address would only repeat it.
        let denial = if decision.verdict == Verdict::Report {
            *decision
        } else {
            p.decision(decision.profile, false, reason, rule)
        };
        if denial.verdict == Verdict::Report {
            return Ok(Permit { decision: denial, upstream: SocketAddr::new(ip, port) });
        }
        Err(denial)
    }
}

// === impl CompiledProfile ===

impl CompiledProfile {
    fn decision(&self, profile: ProfileId, allowed: bool, reason: Reason, rule: Option<RuleId>) -> Decision {
        let verdict = match (allowed, self.mode) {
            (true, _) => Verdict::Allow,
            (false, Mode::Enforce) => Verdict::Deny,
            (false, Mode::Report) => Verdict::Report,
        };
        Decision { verdict, reason, rule, profile, mode: self.mode }
    }
}

// === impl HostIndex ===

impl HostIndex {
    fn insert(&mut self, pattern: &HostPattern, rule: RuleId, ports: &Ports) {
        let key: Box<str> = pattern.name().as_str().into();
        let entry = (rule, ports.clone());
        match pattern {
            HostPattern::Exact(_) => self.exact.entry(key).or_default().push(entry),
            HostPattern::Subdomains(_) => self.subdomains.entry(key).or_default().push(entry),
            HostPattern::ApexAndSubdomains(_) => {
                self.exact.entry(key.clone()).or_default().push(entry.clone());
                self.subdomains.entry(key).or_default().push(entry);
            }
        }
    }

    fn lookup(&self, host: &HostName, port: u16) -> HostHit {
        let mut wrong_port = None;
        for (i, suffix) in host.suffixes().enumerate() {
            let table = if i == 0 { &self.exact } else { &self.subdomains };
            if let Some(entries) = table.get(suffix) {
                if let Some((rule, _)) = entries.iter().find(|(_, ports)| ports.contains(port)) {
                    return HostHit::Allowed(*rule);
                }
                wrong_port = wrong_port.or(entries.first().map(|(r, _)| *r));
            }
        }
        wrong_port.map_or(HostHit::None, HostHit::WrongPort)
    }
}
