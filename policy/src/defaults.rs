//! The embedded default policy: the seed's allowlist (the three public git hosts and the npm
//! and Python package registries' hosts), used when no policy file is given.

use crate::{CompiledPolicy, PolicyError};

/// The embedded default policy's text.
pub const DEFAULT_POLICY_YAML: &str = include_str!("default.yaml");

/// The name the embedded default goes by in logs and errors.
pub const DEFAULT_POLICY_ORIGIN: &str = "<embedded default>";

/// Compiles the embedded default policy.
pub fn embedded_default() -> Result<CompiledPolicy, PolicyError> {
    CompiledPolicy::from_yaml(DEFAULT_POLICY_ORIGIN, DEFAULT_POLICY_YAML)
}
