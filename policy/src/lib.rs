//! Sandgate's policy: which destinations each sandbox may reach, and why.
//!
//! A YAML document (`version: 1`) flows through three types: `raw` serde DTOs (private), the
//! validated [`Policy`], and the indexed [`CompiledPolicy`] the proxy shares per connection.
//! This crate is pure: no I/O, no async, no logging. It takes `&str` and `IpAddr` and returns
//! values; the proxy does the rest.

mod compiled;
mod credential;
mod decision;
mod defaults;
mod error;
mod host;
mod net;
mod parse;
mod raw;
mod rules;

pub use compiled::CompiledPolicy;
pub use credential::{CompiledCredential, CompiledGitRule, GitOp, GitVerdict, smart_http};
pub use decision::{Decision, Mode, Permit, ProfileId, Reason, RuleId, Verdict};
pub use defaults::{DEFAULT_POLICY_ORIGIN, DEFAULT_POLICY_YAML, embedded_default};
pub use error::{HostPatternProblem, Location, PolicyError, PolicyErrorKind};
pub use host::{Host, HostName, HostPattern, MalformedHost};
pub use net::{AddrClass, classify};
pub use parse::parse;
pub use rules::{Apply, Credential, DEFAULT_ALLOW_PORTS, GitRule, Policy, Ports, Profile, Rule, RuleTarget};

#[cfg(test)]
mod tests;
