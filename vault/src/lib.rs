//! Sandgate's secret vault: git tokens, provider keys and kubeconfigs sealed at rest with
//! AES-256-GCM (ring), and held in memory only as [`Secret`], which never prints, never
//! serialises and is zeroed on drop. A leaf crate, so the rule "a secret never reaches a log, a
//! metric or an error" is auditable in one place.

mod error;
mod file;
mod key;
mod seal;
mod secret;

pub use error::VaultError;
pub use file::Vault;
pub use key::{KEY_ENV, VaultKey};
pub use secret::Secret;
