//! Vault errors. None of them carries a secret value: only names, paths and what to do.

use std::path::PathBuf;

/// What went wrong with the vault or its key.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// The key file is missing and was not to be created.
    #[error(
        "no vault key at {path}; create one with `sandgate secret set` (it makes the key on first use) or set {env}"
    )]
    MissingKey {
        /// Where it was looked for.
        path: PathBuf,
        /// The environment variable that can hold it instead.
        env: &'static str,
    },
    /// The key is not 32 bytes (or not base64 in the environment variable).
    #[error("the vault key from {source_name} is not a 256-bit key ({problem}); it must hold 32 random bytes")]
    BadKey {
        /// The file or variable it came from.
        source_name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A key file readable by others than its owner.
    #[error("the vault key {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`")]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// A secret did not decrypt: wrong key, tampered file, or a sealed value moved to another
    /// name.
    #[error("secret `{name}` cannot be opened: the vault key is wrong or the vault file was altered")]
    Unseal {
        /// The secret's name.
        name: String,
    },
    /// No secret of that name.
    #[error("no secret named `{name}`; `sandgate secret list` shows the names")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A name that would not be safe in paths, logs and policies.
    #[error("`{name}` is not a secret name; use 1 to 64 letters, digits, `-`, `_` or `.`")]
    BadName {
        /// The name given.
        name: String,
    },
    /// The vault file is not a vault.
    #[error("{path} is not a Sandgate vault ({problem})")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The random generator or the cipher failed (should not happen).
    #[error("the cryptographic library failed: {0}")]
    Crypto(&'static str),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
