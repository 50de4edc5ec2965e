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

/// Keeps this process's memory, where opened secrets live, out of core files and away from
/// other users' debuggers: the core size limit is set to zero and the process is marked not
/// dumpable. Call it first thing in a process that opens the vault. Best effort: each step that
/// the kernel refuses is reported, and the rest still applies.
pub fn protect_process_memory() -> Vec<String> {
    use rustix::process::{DumpableBehavior, Resource, Rlimit, set_dumpable_behavior, setrlimit};
    let mut refused = Vec::new();
    if let Err(e) = setrlimit(Resource::Core, Rlimit { current: Some(0), maximum: Some(0) }) {
        refused.push(format!("core size limit: {e}"));
    }
    if let Err(e) = set_dumpable_behavior(DumpableBehavior::NotDumpable) {
        refused.push(format!("not dumpable: {e}"));
    }
    refused
}
