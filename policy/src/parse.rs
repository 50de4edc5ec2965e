//! YAML to `Policy`: the only module that knows the YAML crate. Every error carries the
//! document's name, the line and column, the field path and the fix.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde_saphyr::Spanned;

use crate::decision::Mode;
use crate::error::{Location, PolicyError, PolicyErrorKind};
use crate::host::HostPattern;
use crate::raw::{PolicyDoc, RawCredential, RawGitRule, RawMatch, RawMode, RawProfile, RawRule, RawScheme};
use crate::rules::{Apply, Credential, DEFAULT_ALLOW_PORTS, GitRule, Policy, Ports, Profile, Rule, RuleTarget};

/// Longest sandbox id accepted as a profile user.
const MAX_USER_LEN: usize = 128;

/// Parses and validates a policy document. `origin` names it in errors (a file path).
pub fn parse(origin: &str, src: &str) -> Result<Policy, PolicyError> {
    let doc: PolicyDoc = serde_saphyr::from_str(src).map_err(|e| syntax_error(origin, &e))?;
    Validator { origin, names: HashSet::new() }.policy(doc)
}

fn syntax_error(origin: &str, e: &serde_saphyr::Error) -> PolicyError {
    let location = e.location().map(|l| Location { line: l.line(), column: l.column() });
    // The crate renders a source snippet and repeats the position; keep the first line only,
    // without its own "at line X column Y" suffix, since ours is in front.
    let rendered = e.without_snippet().to_string();
    let first = rendered.lines().next().unwrap_or("invalid YAML");
    let message = match first.find(" at line ") {
        Some(i) => &first[..i],
        None => first,
    };
    let mut message = match message.trim() {
        "invalid u16" => "not a port number; write a number from 1 to 65535".to_owned(),
        m if m.starts_with("unknown variant") => format!("{m}; `mode` is `enforce` (the default) or `report`"),
        m => m.to_owned(),
    };
    if message.contains("unknown field") {
        message.push_str("; see `deploy/policies/coding-agent.yaml` for every field a policy may have");
    }
    PolicyError { origin: origin.to_owned(), location, path: String::new(), kind: PolicyErrorKind::Syntax { message } }
}

struct Validator<'a> {
    origin: &'a str,
    names: HashSet<String>,
}

impl Validator<'_> {
    fn err<T>(
        &self,
        at: Option<&serde_saphyr::Location>,
        path: impl Into<String>,
        kind: PolicyErrorKind,
    ) -> Result<T, PolicyError> {
        Err(PolicyError {
            origin: self.origin.to_owned(),
            location: at.map(|l| Location { line: l.line(), column: l.column() }),
            path: path.into(),
            kind,
        })
    }

    fn policy(mut self, doc: PolicyDoc) -> Result<Policy, PolicyError> {
        match &doc.version {
            Some(v) if v.value == 1 => {}
            Some(v) => return self.err(Some(&v.referenced), "version", PolicyErrorKind::Version { found: v.value }),
            None => return self.err(None, "version", PolicyErrorKind::MissingVersion),
        }
        let mut resolve: BTreeMap<crate::host::HostName, Vec<IpAddr>> = BTreeMap::new();
        for (name, addrs) in &doc.resolve {
            let path = format!("resolve.{name}");
            let at = addrs.first().map(|a| &a.referenced);
            let host = match HostPattern::parse(name) {
                Ok(HostPattern::Exact(h)) => h,
                Ok(_) => {
                    return self.err(
                        at,
                        path,
                        PolicyErrorKind::HostPattern {
                            pattern: name.clone(),
                            problem: crate::error::HostPatternProblem::PartialWildcard,
                        },
                    );
                }
                Err(problem) => {
                    return self.err(at, path, PolicyErrorKind::HostPattern { pattern: name.clone(), problem });
                }
            };
            if addrs.is_empty() {
                return self.err(None, path, PolicyErrorKind::EmptyList);
            }
            let mut ips = Vec::with_capacity(addrs.len());
            for (i, a) in addrs.iter().enumerate() {
                match a.value.trim().parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => {
                        return self.err(
                            Some(&a.referenced),
                            format!("{path}[{i}]"),
                            PolicyErrorKind::Address { value: a.value.clone() },
                        );
                    }
                }
            }
            resolve.insert(host, ips);
        }

        let mut profiles = Vec::with_capacity(1 + doc.profiles.len());
        let default_mode = mode(doc.mode);
        profiles.push(Profile {
            name: "default".to_owned(),
            mode: default_mode,
            sources: Vec::new(),
            users: Vec::new(),
            allow: self.rules(&doc.allow, "allow", true)?,
            deny: self.rules(&doc.deny, "deny", false)?,
        });
        for (name, p) in &doc.profiles {
            profiles.push(self.profile(name, p)?);
        }
        let credentials =
            doc.credentials.iter().enumerate().map(|(i, c)| self.credential(c, i)).collect::<Result<Vec<_>, _>>()?;
        let git = doc.git.iter().enumerate().map(|(i, g)| self.git_rule(g, i)).collect::<Result<Vec<_>, _>>()?;
        let policy =
            Policy { origin: self.origin.to_owned(), profiles, resolve, refuse_ech: doc.refuse_ech, credentials, git };
        // Credentials only ever go to hosts the policy allows.
        let compiled = crate::CompiledPolicy::compile(policy.clone());
        for (i, c) in doc.credentials.iter().enumerate() {
            for (j, h) in c.value.hosts.iter().enumerate() {
                let Ok(pattern) = HostPattern::parse(&h.value) else { continue };
                let sample = match &pattern {
                    HostPattern::Exact(n) | HostPattern::ApexAndSubdomains(n) => n.as_str().to_owned(),
                    HostPattern::Subdomains(n) => format!("sandgate-check.{n}"),
                };
                let Ok(host) = crate::Host::parse(&sample) else { continue };
                // Allowed on some port by some profile: `port_not_allowed` means a rule names it.
                let allowed = (0..compiled.profile_count()).any(|p| {
                    let d = compiled.decide(crate::ProfileId(u16::try_from(p).unwrap_or(0)), &host, 443);
                    d.verdict == crate::Verdict::Allow || d.reason == crate::Reason::PortNotAllowed
                });
                if !allowed {
                    return self.err(
                        Some(&h.referenced),
                        format!("credentials[{i}].hosts[{j}]"),
                        PolicyErrorKind::CredentialHostNotAllowed { host: h.value.clone() },
                    );
                }
            }
        }
        Ok(policy)
    }

    fn hosts(
        &self,
        hosts: &[Spanned<String>],
        path: &str,
        at: &serde_saphyr::Location,
    ) -> Result<Vec<HostPattern>, PolicyError> {
        if hosts.is_empty() {
            return self.err(Some(at), format!("{path}.hosts"), PolicyErrorKind::EmptyList);
        }
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                HostPattern::parse(&h.value).or_else(|problem| {
                    self.err(
                        Some(&h.referenced),
                        format!("{path}.hosts[{i}]"),
                        PolicyErrorKind::HostPattern { pattern: h.value.clone(), problem },
                    )
                })
            })
            .collect()
    }

    fn credential(&mut self, c: &Spanned<RawCredential>, i: usize) -> Result<Credential, PolicyError> {
        let path = format!("credentials[{i}]");
        let at = &c.referenced;
        let raw = &c.value;
        let name = raw.name.clone().unwrap_or_else(|| path.clone());
        if !self.names.insert(name.clone()) {
            return self.err(Some(at), format!("{path}.name"), PolicyErrorKind::DuplicateRuleName { name });
        }
        let hosts = self.hosts(&raw.hosts, &path, at)?;
        let secret = raw.secret.value.clone();
        let secret_ok = !secret.is_empty()
            && secret.len() <= 64
            && secret.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !secret_ok {
            return self.err(
                Some(&raw.secret.referenced),
                format!("{path}.secret"),
                PolicyErrorKind::SecretName { name: secret },
            );
        }
        let apply = match raw.scheme.unwrap_or(RawScheme::Basic) {
            RawScheme::Bearer => Apply::Bearer,
            RawScheme::Header => {
                let ok = raw
                    .header
                    .as_ref()
                    .filter(|h| !h.value.is_empty() && h.value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                match ok {
                    Some(h) => Apply::Header { name: h.value.to_ascii_lowercase() },
                    None => return self.err(Some(at), format!("{path}.header"), PolicyErrorKind::HeaderName),
                }
            }
            RawScheme::Basic => {
                let default = hosts.iter().find_map(|h| match h.name().as_str() {
                    "github.com" => Some("x-access-token"),
                    "gitlab.com" => Some("oauth2"),
                    "bitbucket.org" => Some("x-token-auth"),
                    _ => None,
                });
                match raw.username.as_deref().or(default) {
                    Some(u) => Apply::Basic { username: u.to_owned() },
                    None => return self.err(Some(at), format!("{path}.username"), PolicyErrorKind::MissingUsername),
                }
            }
        };
        if let Some(p) = &raw.placeholder
            && p.value.len() < 16
        {
            return self.err(Some(&p.referenced), format!("{path}.placeholder"), PolicyErrorKind::PlaceholderTooShort);
        }
        Ok(Credential {
            name,
            hosts,
            secret: raw.secret.value.clone(),
            apply,
            path_prefix: raw.path_prefix.as_ref().map(|p| p.value.clone()),
            placeholder: raw.placeholder.as_ref().map(|p| p.value.clone()),
        })
    }

    fn git_rule(&self, g: &Spanned<RawGitRule>, i: usize) -> Result<GitRule, PolicyError> {
        let path = format!("git[{i}]");
        let hosts = self.hosts(&g.value.hosts, &path, &g.referenced)?;
        for (field, list) in [("fetch", &g.value.fetch), ("push", &g.value.push)] {
            for (j, pat) in list.iter().enumerate() {
                if let Err(e) = crate::credential::globs(std::slice::from_ref(&pat.value)) {
                    return self.err(
                        Some(&pat.referenced),
                        format!("{path}.{field}[{j}]"),
                        PolicyErrorKind::RepoPattern { pattern: pat.value.clone(), problem: e.kind().to_string() },
                    );
                }
            }
        }
        let strings = |l: &[Spanned<String>]| l.iter().map(|s| s.value.clone()).collect();
        Ok(GitRule { hosts, fetch: strings(&g.value.fetch), push: strings(&g.value.push) })
    }

    fn profile(&mut self, name: &str, p: &Spanned<RawProfile>) -> Result<Profile, PolicyError> {
        let base = format!("profiles.{name}");
        if name == "default" {
            return self.err(Some(&p.referenced), base, PolicyErrorKind::ReservedProfile);
        }
        let empty = RawMatch::default();
        let m = p.value.matches.as_ref().unwrap_or(&empty);
        if m.sources.is_empty() && m.users.is_empty() {
            return self.err(Some(&p.referenced), format!("{base}.match"), PolicyErrorKind::ProfileNeverSelected);
        }
        let mut sources = Vec::with_capacity(m.sources.len());
        for (i, s) in m.sources.iter().enumerate() {
            sources.push(self.cidr(s, &format!("{base}.match.sources[{i}]"))?);
        }
        let mut users = Vec::with_capacity(m.users.len());
        for (i, u) in m.users.iter().enumerate() {
            let ok = !u.value.is_empty()
                && u.value.len() <= MAX_USER_LEN
                && u.value.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !ok {
                return self.err(
                    Some(&u.referenced),
                    format!("{base}.match.users[{i}]"),
                    PolicyErrorKind::User { user: u.value.clone() },
                );
            }
            users.push(u.value.clone());
        }
        Ok(Profile {
            name: name.to_owned(),
            mode: mode(p.value.mode),
            sources,
            users,
            allow: self.rules(&p.value.allow, &format!("{base}.allow"), true)?,
            deny: self.rules(&p.value.deny, &format!("{base}.deny"), false)?,
        })
    }

    fn rules(&mut self, raw: &[Spanned<RawRule>], base: &str, allow: bool) -> Result<Vec<Rule>, PolicyError> {
        raw.iter().enumerate().map(|(i, r)| self.rule(r, &format!("{base}[{i}]"), allow)).collect()
    }

    fn rule(&mut self, r: &Spanned<RawRule>, path: &str, allow: bool) -> Result<Rule, PolicyError> {
        let at = Some(&r.referenced);
        let name = r.value.name.clone().unwrap_or_else(|| path.to_owned());
        if !self.names.insert(name.clone()) {
            return self.err(at, format!("{path}.name"), PolicyErrorKind::DuplicateRuleName { name });
        }
        let target = match (&r.value.hosts, &r.value.cidrs) {
            (Some(hosts), None) => {
                if hosts.is_empty() {
                    return self.err(at, format!("{path}.hosts"), PolicyErrorKind::EmptyList);
                }
                let mut patterns = Vec::with_capacity(hosts.len());
                for (i, h) in hosts.iter().enumerate() {
                    match HostPattern::parse(&h.value) {
                        Ok(p) => patterns.push(p),
                        Err(problem) => {
                            return self.err(
                                Some(&h.referenced),
                                format!("{path}.hosts[{i}]"),
                                PolicyErrorKind::HostPattern { pattern: h.value.clone(), problem },
                            );
                        }
                    }
                }
                RuleTarget::Hosts(patterns)
            }
            (None, Some(cidrs)) => {
                if cidrs.is_empty() {
                    return self.err(at, format!("{path}.cidrs"), PolicyErrorKind::EmptyList);
                }
                let mut nets = Vec::with_capacity(cidrs.len());
                for (i, c) in cidrs.iter().enumerate() {
                    nets.push(self.cidr(c, &format!("{path}.cidrs[{i}]"))?);
                }
                RuleTarget::Cidrs(nets)
            }
            _ => return self.err(at, path, PolicyErrorKind::RuleShape),
        };
        let ports = match &r.value.ports {
            None if allow => Ports::List(DEFAULT_ALLOW_PORTS.into()),
            None => Ports::Any,
            Some(list) if list.is_empty() => return self.err(at, format!("{path}.ports"), PolicyErrorKind::EmptyList),
            Some(list) => {
                let mut ports = Vec::with_capacity(list.len());
                for (i, p) in list.iter().enumerate() {
                    if p.value == 0 {
                        return self.err(Some(&p.referenced), format!("{path}.ports[{i}]"), PolicyErrorKind::Port);
                    }
                    ports.push(p.value);
                }
                Ports::List(ports.into())
            }
        };
        Ok(Rule { name, target, ports })
    }

    fn cidr(&self, s: &Spanned<String>, path: &str) -> Result<IpNet, PolicyError> {
        let v = s.value.trim();
        // A bare address is a one-address network; anything else must parse as a CIDR.
        let net = v.parse::<IpNet>().ok().or_else(|| v.parse::<IpAddr>().ok().map(IpNet::from));
        match net {
            Some(n) => Ok(n.trunc()),
            None => self.err(Some(&s.referenced), path, PolicyErrorKind::Cidr { value: s.value.clone() }),
        }
    }
}

fn mode(m: Option<RawMode>) -> Mode {
    match m {
        Some(RawMode::Report) => Mode::Report,
        Some(RawMode::Enforce) | None => Mode::Enforce,
    }
}
