//! The vault key: 32 random bytes from a key file (created 0600 on first use) or from the
//! `SANDGATE_VAULT_KEY` environment variable (base64), for deployments that inject it.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::error::VaultError;

/// The environment variable that may hold the key, base64-encoded.
pub const KEY_ENV: &str = "SANDGATE_VAULT_KEY";
/// AES-256 key length.
const KEY_LEN: usize = 32;

/// The key that seals and opens every secret in a vault. Zeroed on drop; never printed.
pub struct VaultKey(Zeroizing<[u8; KEY_LEN]>);

impl std::fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VaultKey(..)")
    }
}

impl VaultKey {
    /// The key from `env_value` if given (the content of `SANDGATE_VAULT_KEY`), else from the
    /// file at `path`, which is created with a new random key when `create` is set.
    pub fn load(path: &Path, env_value: Option<&str>, create: bool) -> Result<Self, VaultError> {
        if let Some(v) = env_value {
            let bytes = Zeroizing::new(
                base64::engine::general_purpose::STANDARD
                    .decode(v.trim())
                    .map_err(|_| VaultError::BadKey { source_name: KEY_ENV.to_owned(), problem: "not base64" })?,
            );
            return Self::from_slice(&bytes, KEY_ENV);
        }
        match std::fs::metadata(path) {
            Ok(meta) => {
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(VaultError::KeyPermissions { path: path.to_owned(), mode });
                }
                let bytes = Zeroizing::new(
                    std::fs::read(path).map_err(|source| VaultError::Io { path: path.to_owned(), source })?,
                );
                Self::from_slice(&bytes, &path.display().to_string())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => Self::create(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(VaultError::MissingKey { path: path.to_owned(), env: KEY_ENV })
            }
            Err(source) => Err(VaultError::Io { path: path.to_owned(), source }),
        }
    }

    fn from_slice(bytes: &[u8], source_name: &str) -> Result<Self, VaultError> {
        let arr: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| VaultError::BadKey { source_name: source_name.to_owned(), problem: "wrong length" })?;
        Ok(Self(Zeroizing::new(arr)))
    }

    /// Makes a new random key and writes it to `path` with mode 0600 (never overwriting).
    fn create(path: &Path) -> Result<Self, VaultError> {
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        SystemRandom::new().fill(&mut key[..]).map_err(|_| VaultError::Crypto("random key"))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| VaultError::Io { path: dir.to_owned(), source })?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| VaultError::Io { path: path.to_owned(), source })?;
        f.write_all(&key[..])
            .and_then(|()| f.sync_all())
            .map_err(|source| VaultError::Io { path: path.to_owned(), source })?;
        Ok(Self(key))
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}
