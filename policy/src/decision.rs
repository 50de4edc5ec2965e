//! Decisions: a verdict, the rule that made it and the reason, as values the proxy logs,
//! counts and answers with; and the `Permit` that is the only way to an upstream address.

use std::net::SocketAddr;

use crate::net::AddrClass;

/// Index of a rule in its compiled policy; `CompiledPolicy::rule_name` gives its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleId(pub(crate) u32);

/// Index of a profile in its compiled policy; `CompiledPolicy::profile_name` gives its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProfileId(pub(crate) u16);

/// Whether a profile's denials are enforced or only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Denials close the connection.
    Enforce,
    /// Denials are logged and counted as `report`, and the connection goes through.
    Report,
}

/// The outcome of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Allowed by a rule.
    Allow,
    /// Refused.
    Deny,
    /// Would have been refused, but the profile is in report mode.
    Report,
}

/// Why a decision came out as it did. Closed set: safe as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A host rule allows the name and port.
    HostAllowed,
    /// A CIDR rule allows the address and port.
    CidrAllowed,
    /// A host deny rule matches.
    HostDenied,
    /// A CIDR deny rule matches the address.
    CidrDenied,
    /// No rule allows this host.
    HostNotAllowed,
    /// A rule allows the host, but not on this port.
    PortNotAllowed,
    /// An IP destination that no CIDR rule allows.
    IpNotAllowed,
    /// The name resolved to an address of a refused class.
    Address(AddrClass),
    /// The name has no addresses.
    Unresolvable,
    /// The TLS ClientHello names another host than the CONNECT request.
    SniMismatch,
    /// The ClientHello carries Encrypted Client Hello and the policy refuses it.
    EchRefused,
    /// A git fetch of a repository the git rule does not list.
    GitFetchNotAllowed,
    /// A git push to a repository the git rule does not list.
    GitPushNotAllowed,
    /// A credential's placeholder sent to a host outside that credential's rule.
    PlaceholderElsewhere,
}

/// A decision about one destination for one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Allow, deny, or report (would deny).
    pub verdict: Verdict,
    /// Why.
    pub reason: Reason,
    /// The rule that decided, if one did.
    pub rule: Option<RuleId>,
    /// The client's profile.
    pub profile: ProfileId,
    /// The profile's mode.
    pub mode: Mode,
}

/// Proof that a destination address passed the policy: the only input to the proxy's dialer.
/// It can be made only by `CompiledPolicy::vet`, so no unchecked address can be dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    pub(crate) decision: Decision,
    pub(crate) upstream: SocketAddr,
}

// === impl Mode ===

impl Mode {
    /// `enforce` or `report`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "enforce",
            Self::Report => "report",
        }
    }
}

// === impl Verdict ===

impl Verdict {
    /// `allow`, `deny` or `report`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Report => "report",
        }
    }

    /// Whether the connection may proceed.
    pub fn proceeds(self) -> bool {
        self != Self::Deny
    }
}

// === impl Reason ===

impl Reason {
    /// A stable snake_case name for logs, metric labels and the `X-Sandgate-Reason` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HostAllowed => "host_allowed",
            Self::CidrAllowed => "cidr_allowed",
            Self::HostDenied => "host_denied",
            Self::CidrDenied => "cidr_denied",
            Self::HostNotAllowed => "host_not_allowed",
            Self::PortNotAllowed => "port_not_allowed",
            Self::IpNotAllowed => "ip_not_allowed",
            Self::Address(c) => match c {
                AddrClass::Public => "address_public",
                AddrClass::Metadata => "address_metadata",
                AddrClass::Loopback => "address_loopback",
                AddrClass::Private => "address_private",
                AddrClass::Cgnat => "address_cgnat",
                AddrClass::LinkLocal => "address_link_local",
                AddrClass::UniqueLocal => "address_unique_local",
                AddrClass::Multicast => "address_multicast",
                AddrClass::Unspecified => "address_unspecified",
                AddrClass::Broadcast => "address_broadcast",
                AddrClass::ThisNetwork => "address_this_network",
                AddrClass::EmbedsIpv4 => "address_embeds_ipv4",
                AddrClass::Reserved => "address_reserved",
            },
            Self::Unresolvable => "unresolvable",
            Self::SniMismatch => "sni_mismatch",
            Self::EchRefused => "ech_refused",
            Self::GitFetchNotAllowed => "git_fetch_not_allowed",
            Self::GitPushNotAllowed => "git_push_not_allowed",
            Self::PlaceholderElsewhere => "placeholder_elsewhere",
        }
    }

    /// A short sentence for the agent reading a denial.
    pub fn describe(self) -> &'static str {
        match self {
            Self::HostAllowed => "a host rule allows this host",
            Self::CidrAllowed => "a CIDR rule allows this address",
            Self::HostDenied => "a deny rule matches this host",
            Self::CidrDenied => "a deny rule matches this address",
            Self::HostNotAllowed => "no rule allows this host",
            Self::PortNotAllowed => "this host is allowed, but not on this port",
            Self::IpNotAllowed => "IP destinations need a CIDR rule",
            Self::Address(AddrClass::Metadata) => "the name resolves to a cloud metadata address",
            Self::Address(_) => "the name resolves to a non-public address",
            Self::Unresolvable => "the name does not resolve",
            Self::SniMismatch => "the TLS server name differs from the CONNECT host",
            Self::EchRefused => "Encrypted Client Hello is refused by policy",
            Self::GitFetchNotAllowed => "the git rule does not allow fetching this repository",
            Self::GitPushNotAllowed => "the git rule does not allow pushing to this repository",
            Self::PlaceholderElsewhere => "a credential placeholder was sent to a host outside its rule",
        }
    }
}

// === impl Permit ===

impl Permit {
    /// The vetted address to dial.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The decision this permit carries (allow, or report in report mode).
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}
