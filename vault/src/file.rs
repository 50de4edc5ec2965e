//! The vault file: a JSON document of sealed secrets by name, written atomically (a 0600
//! temporary file, fsync, rename) so a crash leaves the old vault or the new one, never half.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use crate::error::VaultError;
use crate::key::VaultKey;
use crate::seal::{self, Sealed};
use crate::secret::Secret;

/// The `format` field every vault file carries.
const FORMAT: &str = "sandgate-vault";
/// Longest secret name.
const MAX_NAME_LEN: usize = 64;

/// An open vault: its file, its key and the sealed secrets (opened one at a time, on demand).
#[derive(Debug)]
pub struct Vault {
    path: PathBuf,
    key: VaultKey,
    secrets: BTreeMap<String, Sealed>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultFile {
    format: String,
    version: u32,
    secrets: BTreeMap<String, SealedEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SealedEntry {
    nonce: String,
    sealed: String,
}

impl Vault {
    /// Opens the vault at `path` (a missing file is an empty vault) with `key`.
    pub fn open(path: &Path, key: VaultKey) -> Result<Self, VaultError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self { path: path.to_owned(), key, secrets: BTreeMap::new() });
            }
            Err(source) => return Err(VaultError::Io { path: path.to_owned(), source }),
        };
        let bad = |problem: String| VaultError::Format { path: path.to_owned(), problem };
        let file: VaultFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if file.format != FORMAT || file.version != 1 {
            return Err(bad(format!("format {} version {}, expected {FORMAT} version 1", file.format, file.version)));
        }
        let mut secrets = BTreeMap::new();
        for (name, e) in file.secrets {
            let nonce = B64.decode(&e.nonce).ok().and_then(|n| n.try_into().ok());
            let ciphertext = B64.decode(&e.sealed).ok();
            match (nonce, ciphertext) {
                (Some(nonce), Some(ciphertext)) => secrets.insert(name, Sealed { nonce, ciphertext }),
                _ => return Err(bad(format!("secret `{name}` is not valid base64"))),
            };
        }
        Ok(Self { path: path.to_owned(), key, secrets })
    }

    /// The names of every secret, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.secrets.keys().map(String::as_str)
    }

    /// Opens the secret `name`.
    pub fn get(&self, name: &str) -> Result<Secret<Vec<u8>>, VaultError> {
        let sealed = self.secrets.get(name).ok_or_else(|| VaultError::NotFound { name: name.to_owned() })?;
        seal::open(&self.key, name, sealed)
    }

    /// Seals `value` as `name` (replacing any secret of that name) and saves the vault.
    pub fn set(&mut self, name: &str, value: &Secret<Vec<u8>>) -> Result<(), VaultError> {
        check_name(name)?;
        let sealed = seal::seal(&self.key, name, value.expose())?;
        self.secrets.insert(name.to_owned(), sealed);
        self.save()
    }

    /// Removes `name` and saves the vault; `false` if there was no such secret.
    pub fn remove(&mut self, name: &str) -> Result<bool, VaultError> {
        if self.secrets.remove(name).is_none() {
            return Ok(false);
        }
        self.save().map(|()| true)
    }

    fn save(&self) -> Result<(), VaultError> {
        let file = VaultFile {
            format: FORMAT.to_owned(),
            version: 1,
            secrets: self
                .secrets
                .iter()
                .map(|(k, s)| {
                    (k.clone(), SealedEntry { nonce: B64.encode(s.nonce), sealed: B64.encode(&s.ciphertext) })
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&file)
            .map_err(|e| VaultError::Format { path: self.path.clone(), problem: e.to_string() })?;
        let io = |source| VaultError::Io { path: self.path.clone(), source };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = self.path.with_extension("tmp");
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)
    }
}

fn check_name(name: &str) -> Result<(), VaultError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok { Ok(()) } else { Err(VaultError::BadName { name: name.to_owned() }) }
}

#[cfg(test)]
mod tests;
