//! Policy errors: where in the document a problem is, and what to write instead.

use std::fmt;

/// A 1-based line and column in the policy document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    /// Line, counted from 1.
    pub line: u64,
    /// Column, counted from 1.
    pub column: u64,
}

/// A policy document that cannot be used, with the place and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// The document's name as the user knows it (a file path, or `<embedded default>`).
    pub origin: String,
    /// Where the problem is, when the parser could tell.
    pub location: Option<Location>,
    /// The field path, such as `profiles.ci.allow[2].hosts[0]`; empty for the document itself.
    pub path: String,
    /// What is wrong.
    pub kind: PolicyErrorKind,
}

/// What is wrong with a policy document; each message ends with how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyErrorKind {
    /// The YAML could not be read into the policy's shape (syntax, unknown field, wrong type).
    #[error("{message}")]
    Syntax {
        /// The parser's description.
        message: String,
    },
    /// `version` is missing.
    #[error("the document has no `version`; add `version: 1` as its first line")]
    MissingVersion,
    /// `version` is not 1.
    #[error("unsupported policy version {found}; this Sandgate reads `version: 1`")]
    Version {
        /// The version found (0 when absent).
        found: u64,
    },
    /// A host pattern is malformed or could match far more than intended.
    #[error("`{pattern}`: {problem}")]
    HostPattern {
        /// The pattern as written.
        pattern: String,
        /// Why it is refused and what to write.
        problem: HostPatternProblem,
    },
    /// A CIDR or address could not be parsed.
    #[error(
        "`{value}` is not an IP network; write an address with a prefix length such as `10.0.0.0/8` or `2001:db8::/32`"
    )]
    Cidr {
        /// The value as written.
        value: String,
    },
    /// An address in `resolve` could not be parsed.
    #[error("`{value}` is not an IP address; `resolve` maps a name to addresses such as `127.0.0.1` or `::1`")]
    Address {
        /// The value as written.
        value: String,
    },
    /// A port of 0.
    #[error("port 0 is not a port; write a number from 1 to 65535")]
    Port,
    /// A rule that names neither hosts nor cidrs, or both.
    #[error("a rule needs exactly one of `hosts:` or `cidrs:`; split it into two rules if it needs both")]
    RuleShape,
    /// An empty list where an entry is needed.
    #[error("the list is empty; add at least one entry or remove the field")]
    EmptyList,
    /// A profile named `default` under `profiles:`.
    #[error("the default profile is the document's top-level `allow`/`deny`/`mode`; rename this profile")]
    ReservedProfile,
    /// A profile without any `match`.
    #[error("a named profile needs `match:` with `sources:` and/or `users:`, or no client would ever select it")]
    ProfileNeverSelected,
    /// A user name that cannot appear in a Proxy-Authorization header.
    #[error("`{user}`: a sandbox id is 1 to 128 characters of letters, digits, `-`, `_` and `.`")]
    User {
        /// The value as written.
        user: String,
    },
    /// A credential rule for a host no profile allows.
    #[error(
        "`{host}` gets a credential but no rule allows it; add it to an allow rule (credentials only ever go to allowed hosts)"
    )]
    CredentialHostNotAllowed {
        /// The host pattern.
        host: String,
    },
    /// A Basic credential for a host without a default username.
    #[error(
        "a `basic` credential needs `username:` here (the documented defaults are x-access-token for github.com, oauth2 for gitlab.com, x-token-auth for bitbucket.org)"
    )]
    MissingUsername,
    /// A `header` credential without a valid header name.
    #[error("a `header` credential needs `header:` with an HTTP header name such as `X-Api-Key`")]
    HeaderName,
    /// A secret name the vault would refuse.
    #[error("`{name}` is not a secret name; use 1 to 64 letters, digits, `-`, `_` or `.`")]
    SecretName {
        /// The name as written.
        name: String,
    },
    /// A placeholder short enough to appear by chance.
    #[error("a placeholder must be at least 16 characters so it never appears by chance")]
    PlaceholderTooShort,
    /// A repository glob that does not compile.
    #[error("`{pattern}` is not an owner/repo pattern ({problem}); write e.g. `org/*` or `org/app`")]
    RepoPattern {
        /// The pattern.
        pattern: String,
        /// Why.
        problem: String,
    },
    /// Two rules share a name.
    #[error("rule name `{name}` is used twice; rule names must be unique so logs point at one rule")]
    DuplicateRuleName {
        /// The repeated name.
        name: String,
    },
}

/// Why a host pattern is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPatternProblem {
    /// `*` alone, or `*.` with nothing after it.
    MatchesEverything,
    /// `*` inside a label or not leading (`*github.com`, `api.*.com`).
    PartialWildcard,
    /// A wildcard over a single label (`*.com`), which covers a whole top-level domain.
    WholeTopLevel,
    /// An IP address written as a host.
    IpLiteral,
    /// Empty labels, bad characters, or over-long names.
    Malformed,
}

// === impl PolicyError ===

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(loc) = self.location {
            write!(f, ":{}:{}", loc.line, loc.column)?;
        }
        f.write_str(": ")?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for PolicyError {}

// === impl HostPatternProblem ===

impl fmt::Display for HostPatternProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::MatchesEverything => {
                "matches every host; list the hosts to allow, such as `github.com` or `*.github.com`"
            }
            Self::PartialWildcard => {
                "a wildcard must be a whole leading label; write `*.example.com` (subdomains only) or `**.example.com` (the name and its subdomains)"
            }
            Self::WholeTopLevel => {
                "a wildcard over a single label covers a whole top-level domain; name the domain, such as `*.example.com`"
            }
            Self::IpLiteral => "an IP address is not a host name; put it under `cidrs:`, such as `192.0.2.10/32`",
            Self::Malformed => {
                "not a host name; use letters, digits, `-` and `_` in dot-separated labels of 1 to 63 characters"
            }
        })
    }
}
