//! Cost of Sandgate's CA per intercepted host: minting a leaf (a P-256 key and a signature),
//! and serving one from the cache.
#![expect(clippy::unwrap_used, reason = "a benchmark of fixed inputs")]

mod timing;

use sandgate_proxy::intercept::CertAuthority;
use sandgate_vault::{Vault, VaultKey};

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let key = || VaultKey::load(&dir.path().join("k"), None, true).unwrap();
    let mut vault = Vault::open(&dir.path().join("v.json"), key()).unwrap();
    CertAuthority::init(&mut vault, false).unwrap();
    let ca = CertAuthority::load(&vault).unwrap();
    timing::bench("mint a leaf (P-256 key + signature)", || ca.mint("github.com").unwrap());
    ca.leaf("github.com").unwrap();
    timing::bench("leaf from the cache", || ca.leaf("github.com").unwrap());
}
