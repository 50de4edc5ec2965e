use super::*;
use crate::KEY_ENV;

const CANARY: &[u8] = b"ghp_CANARYcanary0123456789abcdefABCDEF";

fn key(dir: &Path) -> VaultKey {
    VaultKey::load(&dir.join("key"), None, true).unwrap()
}

#[test]
fn secrets_round_trip_and_are_sealed_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    let mut v = Vault::open(&path, key(dir.path())).unwrap();
    v.set("github-token", &Secret::new(CANARY.to_vec())).unwrap();
    v.set("gitlab-token", &Secret::new(b"glpat-other".to_vec())).unwrap();
    let again = Vault::open(&path, key(dir.path())).unwrap();
    assert_eq!(again.get("github-token").unwrap().expose(), CANARY);
    assert_eq!(again.names().collect::<Vec<_>>(), ["github-token", "gitlab-token"]);
    let on_disk = std::fs::read(&path).unwrap();
    assert!(!on_disk.windows(CANARY.len()).any(|w| w == CANARY), "plaintext on disk");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(dir.path().join("key")).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_wrong_key_is_an_error_not_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    Vault::open(&path, key(dir.path())).unwrap().set("t", &Secret::new(CANARY.to_vec())).unwrap();
    let other = tempfile::tempdir().unwrap();
    let v = Vault::open(&path, key(other.path())).unwrap();
    let err = v.get("t").unwrap_err();
    assert!(matches!(err, VaultError::Unseal { .. }), "{err}");
    assert_eq!(err.to_string(), "secret `t` cannot be opened: the vault key is wrong or the vault file was altered");
}

#[test]
fn a_tampered_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    Vault::open(&path, key(dir.path())).unwrap().set("t", &Secret::new(CANARY.to_vec())).unwrap();
    let mut file: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let sealed = file["secrets"]["t"]["sealed"].as_str().unwrap().to_owned();
    let mut bytes = B64.decode(sealed).unwrap();
    bytes[0] ^= 1;
    file["secrets"]["t"]["sealed"] = B64.encode(bytes).into();
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let v = Vault::open(&path, key(dir.path())).unwrap();
    assert!(matches!(v.get("t"), Err(VaultError::Unseal { .. })));
    std::fs::write(&path, "not json").unwrap();
    assert!(matches!(Vault::open(&path, key(dir.path())), Err(VaultError::Format { .. })));
}

#[test]
fn a_sealed_value_moved_to_another_name_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    let mut v = Vault::open(&path, key(dir.path())).unwrap();
    v.set("prod-token", &Secret::new(CANARY.to_vec())).unwrap();
    v.set("test-token", &Secret::new(b"harmless".to_vec())).unwrap();
    let mut file: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    file["secrets"]["test-token"] = file["secrets"]["prod-token"].clone();
    std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
    let v = Vault::open(&path, key(dir.path())).unwrap();
    assert!(matches!(v.get("test-token"), Err(VaultError::Unseal { .. })), "name is associated data");
    assert_eq!(v.get("prod-token").unwrap().expose(), CANARY);
}

#[test]
fn keys_missing_loose_or_malformed_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = VaultKey::load(&dir.path().join("nope"), None, false).unwrap_err();
    assert!(missing.to_string().contains("no vault key at") && missing.to_string().contains(KEY_ENV), "{missing}");
    let loose = dir.path().join("loose");
    std::fs::write(&loose, [7u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(VaultKey::load(&loose, None, false), Err(VaultError::KeyPermissions { .. })));
    let short = dir.path().join("short");
    std::fs::write(&short, [7u8; 16]).unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(VaultKey::load(&short, None, false), Err(VaultError::BadKey { .. })));
    // The environment form: base64 of 32 bytes, and it opens what the same key sealed.
    let env = B64.encode([9u8; 32]);
    let k = VaultKey::load(&dir.path().join("unused"), Some(&env), false).unwrap();
    let path = dir.path().join("v.json");
    Vault::open(&path, k).unwrap().set("n", &Secret::new(CANARY.to_vec())).unwrap();
    let k = VaultKey::load(&dir.path().join("unused"), Some(&env), false).unwrap();
    assert_eq!(Vault::open(&path, k).unwrap().get("n").unwrap().expose(), CANARY);
    assert!(matches!(VaultKey::load(&dir.path().join("unused"), Some("!!"), false), Err(VaultError::BadKey { .. })));
}

#[test]
fn names_are_checked_and_removal_persists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vault.json");
    let mut v = Vault::open(&path, key(dir.path())).unwrap();
    assert!(matches!(v.set("bad name", &Secret::new(vec![1])), Err(VaultError::BadName { .. })));
    v.set("a", &Secret::new(vec![1])).unwrap();
    assert!(v.remove("a").unwrap());
    assert!(!v.remove("a").unwrap());
    let v = Vault::open(&path, key(dir.path())).unwrap();
    assert_eq!(v.names().count(), 0);
    assert!(matches!(v.get("a"), Err(VaultError::NotFound { .. })));
}
