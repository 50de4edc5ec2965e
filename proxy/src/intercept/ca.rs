//! Sandgate's certificate authority: an ECDSA P-256 key (rcgen on ring) whose PKCS#8 form is
//! sealed in the vault, and the short-lived leaf certificates it mints per server name for
//! intercepted hosts, cached in a bounded LRU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;
use sandgate_vault::{Secret, Vault, VaultError};

/// Vault name of the CA's private key (PKCS#8 DER).
pub const CA_KEY_SECRET: &str = "sandgate-ca-key";
/// Vault name of the CA's certificate (PEM; public, kept beside its key).
pub const CA_CERT_SECRET: &str = "sandgate-ca-cert";
/// How long a minted leaf is valid: short, since a new one costs under a millisecond.
const LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Leaves are re-minted this long before they expire.
const LEAF_REFRESH: Duration = Duration::from_secs(3600);
/// Leaves kept in the cache (one per intercepted server name).
const LEAF_CACHE: usize = 1024;
/// CA certificates are valid for ten years; rotate by running `ca init --force`.
const CA_LIFETIME_DAYS: i64 = 3650;

/// Why the CA could not be created, loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The vault failed (missing CA: run `sandgate ca init`).
    #[error("{0}")]
    Vault(#[from] VaultError),
    /// The stored key or a certificate could not be used.
    #[error("certificate authority: {0}")]
    Cert(String),
}

/// The loaded CA: issues leaves, shares its certificate.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cache: Mutex<LeafCache>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CertAuthority(..)")
    }
}

#[derive(Default)]
struct LeafCache {
    leaves: HashMap<String, (Arc<CertifiedKey>, Instant, u64)>,
    tick: u64,
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "Sandgate egress CA");
    dn.push(DnType::OrganizationName, "Sandgate");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn cert_err(e: impl std::fmt::Display) -> CaError {
    CaError::Cert(e.to_string())
}

// === impl CertAuthority ===

impl CertAuthority {
    /// Creates a new CA and seals its key (and certificate) in `vault`. Refuses to replace an
    /// existing CA unless `force`, since sandboxes trust the old one.
    pub fn init(vault: &mut Vault, force: bool) -> Result<String, CaError> {
        if !force && vault.names().any(|n| n == CA_KEY_SECRET) {
            return Err(CaError::Cert(
                "a CA already exists in this vault; `sandgate ca cert` prints it (use --force to replace it, then re-trust it everywhere)"
                    .to_owned(),
            ));
        }
        let key = KeyPair::generate().map_err(cert_err)?;
        let mut params = ca_params();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(CA_LIFETIME_DAYS);
        let cert = params.self_signed(&key).map_err(cert_err)?;
        let pem = cert.pem();
        vault.set(CA_KEY_SECRET, &Secret::new(key.serialize_der()))?;
        vault.set(CA_CERT_SECRET, &Secret::new(pem.clone().into_bytes()))?;
        Ok(pem)
    }

    /// Loads the CA from `vault`.
    pub fn load(vault: &Vault) -> Result<Self, CaError> {
        let key_der = vault.get(CA_KEY_SECRET)?;
        let key = KeyPair::try_from(key_der.expose().as_slice()).map_err(cert_err)?;
        let cert = vault.get(CA_CERT_SECRET)?;
        let cert_pem = String::from_utf8(cert.expose().clone()).map_err(cert_err)?;
        Ok(Self { issuer: Issuer::new(ca_params(), key), cert_pem, cache: Mutex::new(LeafCache::default()) })
    }

    /// The CA certificate (PEM), for sandboxes to trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf for `name`, from the cache or freshly minted (then `true`).
    pub fn leaf(&self, name: &str) -> Result<(Arc<CertifiedKey>, bool), CaError> {
        let now = Instant::now();
        if let Ok(mut cache) = self.cache.lock() {
            cache.tick += 1;
            let tick = cache.tick;
            if let Some((leaf, expires, used)) = cache.leaves.get_mut(name)
                && *expires > now + LEAF_REFRESH
            {
                *used = tick;
                return Ok((leaf.clone(), false));
            }
        }
        let leaf = Arc::new(self.mint(name)?);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.leaves.len() >= LEAF_CACHE
                && let Some(oldest) = cache.leaves.iter().min_by_key(|(_, (_, _, used))| *used).map(|(k, _)| k.clone())
            {
                cache.leaves.remove(&oldest);
            }
            let tick = cache.tick;
            cache.leaves.insert(name.to_owned(), (leaf.clone(), now + LEAF_LIFETIME, tick));
        }
        Ok((leaf, true))
    }

    /// Mints a leaf for `name`: a new P-256 key, valid from an hour ago for a day.
    pub fn mint(&self, name: &str) -> Result<CertifiedKey, CaError> {
        let key = KeyPair::generate().map_err(cert_err)?;
        let mut params = CertificateParams::new(vec![name.to_owned()]).map_err(cert_err)?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::try_from(LEAF_LIFETIME).map_err(cert_err)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_err)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_ecdsa_type(&der).map_err(cert_err)?;
        Ok(CertifiedKey::new(vec![CertificateDer::from(cert.der().to_vec())], signer))
    }
}
