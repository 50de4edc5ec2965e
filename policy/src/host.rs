//! Host names and host patterns: normalised once, matched by label suffix.
//!
//! `example.com` matches only itself, `*.example.com` matches strict subdomains (not the apex,
//! as in linkerd, smokescreen and cilium), and `**.example.com` matches the apex and every
//! subdomain. Nothing else is a pattern: no inner or partial wildcards, no globs.

use std::fmt;
use std::net::IpAddr;

use crate::error::HostPatternProblem;

/// Longest host name accepted, from RFC 1035 (253 characters in text form).
const MAX_NAME_LEN: usize = 253;
/// Longest label accepted, from RFC 1035.
const MAX_LABEL_LEN: usize = 63;

/// A host name in canonical form: lower case ASCII (IDNA names in punycode), no trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostName(Box<str>);

/// A host rule's pattern, as written in the policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// `example.com`: this name only.
    Exact(HostName),
    /// `*.example.com`: strict subdomains of the name.
    Subdomains(HostName),
    /// `**.example.com`: the name and its subdomains.
    ApexAndSubdomains(HostName),
}

/// A destination host as a client named it: a name, or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, normalised.
    Name(HostName),
    /// An IP literal (`[::1]` already unbracketed).
    Ip(IpAddr),
}

/// Why a host a client sent could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed host name")]
pub struct MalformedHost;

// === impl HostName ===

impl HostName {
    /// Normalises a host name: lower case, trailing dot removed, IDNA to punycode, validated.
    pub fn parse(input: &str) -> Result<Self, MalformedHost> {
        let trimmed = input.strip_suffix('.').unwrap_or(input);
        if trimmed.is_empty() || trimmed.len() > MAX_NAME_LEN * 4 {
            return Err(MalformedHost);
        }
        // Fast path: plain ASCII names (nearly all traffic) skip the IDNA machinery.
        let name = if trimmed.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_') {
            trimmed.to_ascii_lowercase()
        } else {
            idna::domain_to_ascii(trimmed).map_err(|_| MalformedHost)?
        };
        validate_name(&name)?;
        Ok(Self(name.into_boxed_str()))
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This name and each parent domain, longest first: `a.b.c`, `b.c`, `c`.
    pub(crate) fn suffixes(&self) -> impl Iterator<Item = &str> {
        let s: &str = &self.0;
        std::iter::once(s).chain(s.match_indices('.').map(move |(i, _)| &s[i + 1..]))
    }

    fn label_count(&self) -> usize {
        self.0.split('.').count()
    }
}

fn validate_name(name: &str) -> Result<(), MalformedHost> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(MalformedHost);
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= MAX_LABEL_LEN
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(MalformedHost);
        }
    }
    // An all-numeric final label is an IPv4 literal in disguise (`1.2.3.4`, `0x7f.1`): not a name.
    if name.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err(MalformedHost);
    }
    Ok(())
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === impl HostPattern ===

impl HostPattern {
    /// Parses a pattern as written in a policy, refusing any that could over-match.
    pub fn parse(input: &str) -> Result<Self, HostPatternProblem> {
        let s = input.trim();
        if s == "*" || s == "**" || s == "*." || s == "**." || s.is_empty() && !input.is_empty() {
            return Err(HostPatternProblem::MatchesEverything);
        }
        if unbracket(s).parse::<IpAddr>().is_ok() {
            return Err(HostPatternProblem::IpLiteral);
        }
        let (kind, rest): (fn(HostName) -> Self, &str) = if let Some(rest) = s.strip_prefix("**.") {
            (Self::ApexAndSubdomains, rest)
        } else if let Some(rest) = s.strip_prefix("*.") {
            (Self::Subdomains, rest)
        } else {
            (Self::Exact, s)
        };
        if rest.contains('*') {
            return Err(HostPatternProblem::PartialWildcard);
        }
        let name = HostName::parse(rest).map_err(|_| HostPatternProblem::Malformed)?;
        let pattern = kind(name);
        if !matches!(pattern, Self::Exact(_)) && pattern.name().label_count() < 2 {
            return Err(HostPatternProblem::WholeTopLevel);
        }
        Ok(pattern)
    }

    /// The name the pattern is anchored on.
    pub fn name(&self) -> &HostName {
        match self {
            Self::Exact(n) | Self::Subdomains(n) | Self::ApexAndSubdomains(n) => n,
        }
    }

    /// Whether `host` is covered by this pattern (the slow, obvious form; the compiled policy
    /// uses an index with the same meaning).
    pub fn matches(&self, host: &HostName) -> bool {
        let h = host.as_str();
        let n = self.name().as_str();
        let strict_sub = h.len() > n.len() && h.ends_with(n) && h.as_bytes()[h.len() - n.len() - 1] == b'.';
        match self {
            Self::Exact(_) => h == n,
            Self::Subdomains(_) => strict_sub,
            Self::ApexAndSubdomains(_) => h == n || strict_sub,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(n) => write!(f, "{n}"),
            Self::Subdomains(n) => write!(f, "*.{n}"),
            Self::ApexAndSubdomains(n) => write!(f, "**.{n}"),
        }
    }
}

// === impl Host ===

impl Host {
    /// Parses the host part of an authority, SNI or Host header: an IP literal (IPv6 may be in
    /// brackets) or a name, normalised.
    pub fn parse(input: &str) -> Result<Self, MalformedHost> {
        let s = unbracket(input);
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        HostName::parse(s).map(Self::Name)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(n) => write!(f, "{n}"),
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

fn unbracket(s: &str) -> &str {
    s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> HostName {
        HostName::parse(s).unwrap()
    }

    #[test]
    fn names_normalise() {
        let cases = [
            ("upper case folds", "GitHub.COM", "github.com"),
            ("trailing dot goes", "github.com.", "github.com"),
            ("idna becomes punycode", "bücher.example", "xn--bcher-kva.example"),
            ("underscore is kept", "_acme.example.com", "_acme.example.com"),
        ];
        for (case, input, want) in cases {
            assert_eq!(name(input).as_str(), want, "{case}");
        }
    }

    #[test]
    fn bad_names_are_refused() {
        for (case, input) in [
            ("empty", ""),
            ("lone dot", "."),
            ("empty label", "a..b"),
            ("space", "a b.com"),
            ("leading hyphen", "-a.com"),
            ("numeric tld is an ip in disguise", "1.2.3.4"),
            ("hex ip in disguise", "0x7f.1"),
            ("label too long", &format!("{}.com", "a".repeat(64))),
        ] {
            assert!(HostName::parse(input).is_err(), "{case}: {input:?}");
        }
    }

    #[test]
    fn patterns_parse_or_say_why() {
        use HostPatternProblem::*;
        let cases: [(&str, &str, Result<&str, HostPatternProblem>); 10] = [
            ("exact", "github.com", Ok("github.com")),
            ("subdomains", "*.github.com", Ok("*.github.com")),
            ("apex and subdomains", "**.GitHub.com.", Ok("**.github.com")),
            ("bare star", "*", Err(MatchesEverything)),
            ("star dot", "*.", Err(MatchesEverything)),
            ("glued star", "*github.com", Err(PartialWildcard)),
            ("inner star", "api.*.com", Err(PartialWildcard)),
            ("whole tld", "*.com", Err(WholeTopLevel)),
            ("ip literal", "10.0.0.1", Err(IpLiteral)),
            ("ipv6 literal", "[::1]", Err(IpLiteral)),
        ];
        for (case, input, want) in cases {
            let got = HostPattern::parse(input).map(|p| p.to_string());
            assert_eq!(got, want.map(str::to_owned), "{case}");
        }
    }

    #[test]
    fn suffixes_longest_first() {
        let n = name("a.b.c");
        assert_eq!(n.suffixes().collect::<Vec<_>>(), ["a.b.c", "b.c", "c"]);
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,8}[a-z]"
    }

    proptest! {
        #[test]
        fn subdomain_pattern_matches_iff_strict_suffix(
            host in prop::collection::vec(label(), 1..5),
            domain in prop::collection::vec(label(), 2..4),
        ) {
            let d = domain.join(".");
            let h = host.join(".");
            let hn = name(&h);
            let sub = HostPattern::parse(&format!("*.{d}")).unwrap();
            let apex = HostPattern::parse(&format!("**.{d}")).unwrap();
            prop_assert_eq!(sub.matches(&hn), h.ends_with(&format!(".{d}")));
            prop_assert_eq!(apex.matches(&hn), h == d || h.ends_with(&format!(".{d}")));
            // Extending the host by a label under the domain always matches both.
            let child = name(&format!("{h}.{d}"));
            prop_assert!(sub.matches(&child) && apex.matches(&child));
        }

        #[test]
        fn glued_prefixes_never_match(prefix in label(), domain in prop::collection::vec(label(), 2..4)) {
            let d = domain.join(".");
            let glued = name(&format!("{prefix}{d}"));
            let sub = HostPattern::parse(&format!("*.{d}")).unwrap();
            prop_assert!(!sub.matches(&glued));
        }
    }
}
