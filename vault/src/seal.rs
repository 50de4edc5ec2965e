//! AES-256-GCM sealing (ring): a fresh random nonce per seal, and the secret's name as
//! associated data, so a sealed value copied under another name does not open.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::VaultError;
use crate::key::VaultKey;
use crate::secret::Secret;

/// A sealed secret: the nonce and the ciphertext with its tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sealed {
    pub(crate) nonce: [u8; NONCE_LEN],
    pub(crate) ciphertext: Vec<u8>,
}

fn cipher(key: &VaultKey) -> Result<LessSafeKey, VaultError> {
    UnboundKey::new(&AES_256_GCM, key.bytes()).map(LessSafeKey::new).map_err(|_| VaultError::Crypto("key setup"))
}

/// Seals `plaintext` under `name`.
pub(crate) fn seal(key: &VaultKey, name: &str, plaintext: &[u8]) -> Result<Sealed, VaultError> {
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new().fill(&mut nonce).map_err(|_| VaultError::Crypto("random nonce"))?;
    let mut in_out = plaintext.to_vec();
    cipher(key)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(name.as_bytes()), &mut in_out)
        .map_err(|_| VaultError::Crypto("seal"))?;
    Ok(Sealed { nonce, ciphertext: in_out })
}

/// Opens a sealed value stored under `name`; any mismatch (key, bytes, name) is an error,
/// never garbage.
pub(crate) fn open(key: &VaultKey, name: &str, sealed: &Sealed) -> Result<Secret<Vec<u8>>, VaultError> {
    let mut in_out = sealed.ciphertext.clone();
    let len = cipher(key)?
        .open_in_place(Nonce::assume_unique_for_key(sealed.nonce), Aad::from(name.as_bytes()), &mut in_out)
        .map(|plain| plain.len());
    match len {
        Ok(n) => {
            in_out.truncate(n);
            Ok(Secret::new(in_out))
        }
        Err(_) => {
            zeroize::Zeroize::zeroize(&mut in_out);
            Err(VaultError::Unseal { name: name.to_owned() })
        }
    }
}
