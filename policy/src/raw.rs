//! The policy document's serde shape. Only `parse` reads these; they never leave the crate.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

/// The whole document, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyDoc {
    pub(crate) version: Option<Spanned<u64>>,
    pub(crate) mode: Option<RawMode>,
    #[serde(default)]
    pub(crate) refuse_ech: bool,
    #[serde(default)]
    pub(crate) resolve: BTreeMap<String, Vec<Spanned<String>>>,
    #[serde(default)]
    pub(crate) allow: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub(crate) deny: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub(crate) profiles: BTreeMap<String, Spanned<RawProfile>>,
    #[serde(default)]
    pub(crate) credentials: Vec<Spanned<RawCredential>>,
    #[serde(default)]
    pub(crate) git: Vec<Spanned<RawGitRule>>,
}

/// A credential rule: which vault secret the proxy adds to requests for these hosts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCredential {
    pub(crate) name: Option<String>,
    pub(crate) hosts: Vec<Spanned<String>>,
    pub(crate) secret: Spanned<String>,
    pub(crate) scheme: Option<RawScheme>,
    pub(crate) username: Option<String>,
    pub(crate) header: Option<Spanned<String>>,
    pub(crate) path_prefix: Option<Spanned<String>>,
    pub(crate) placeholder: Option<Spanned<String>>,
}

/// How a credential is applied.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawScheme {
    Basic,
    Bearer,
    Header,
}

/// Repository scoping for git smart HTTP on intercepted hosts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGitRule {
    pub(crate) hosts: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) fetch: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) push: Vec<Spanned<String>>,
}

/// `enforce` or `report`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawMode {
    Enforce,
    Report,
}

/// One allow or deny rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub(crate) name: Option<String>,
    pub(crate) hosts: Option<Vec<Spanned<String>>>,
    pub(crate) cidrs: Option<Vec<Spanned<String>>>,
    pub(crate) ports: Option<Vec<Spanned<u16>>>,
}

/// A named profile.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    #[serde(rename = "match")]
    pub(crate) matches: Option<RawMatch>,
    pub(crate) mode: Option<RawMode>,
    #[serde(default)]
    pub(crate) allow: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub(crate) deny: Vec<Spanned<RawRule>>,
}

/// Which clients select a profile.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    #[serde(default)]
    pub(crate) sources: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) users: Vec<Spanned<String>>,
}
