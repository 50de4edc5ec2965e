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
