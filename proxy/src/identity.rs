//! Who a client is, in node-agent mode: a proxy shared by many sandboxes knows each one by its
//! address and a per-sandbox token (`http://<sandbox>:<token>@proxy:port`), and gives it its
//! profile. Both must match: a stolen token is useless from another pod, and a reused pod
//! address is useless without the token. The table is filled from outside (the agent's watch
//! of pods on its node) and swapped as a whole or per entry; lookups take a read lock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::RwLock;

/// One sandbox the proxy serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The sandbox's name, the `user` of its proxy credential.
    pub sandbox: String,
    /// The only address it may connect from (its pod IP).
    pub addr: IpAddr,
    /// SHA-256 of its token (the proxy never holds the token itself).
    pub token_sha256: [u8; 32],
    /// The policy profile it gets.
    pub profile: String,
}

/// A `Proxy-Authorization: Basic` credential: the sandbox's name and its token. The token
/// is never logged (`Debug` leaves it out).
pub(crate) struct Credential {
    /// The user: a sandbox name.
    pub(crate) user: String,
    /// Wiped from memory when the credential is dropped.
    token: zeroize::Zeroizing<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("user", &self.user).finish_non_exhaustive()
    }
}

impl Credential {
    /// Parses a `Basic` header value; the user must look like a sandbox name.
    pub(crate) fn from_basic(v: &str) -> Option<Self> {
        use base64::Engine;
        let (scheme, creds) = v.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let decoded = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.decode(creds.trim()).ok()?);
        let text = std::str::from_utf8(&decoded).ok()?;
        let (user, token) = text.split_once(':').unwrap_or((text, ""));
        let ok = !user.is_empty()
            && user.len() <= 128
            && user.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        ok.then(|| Self { user: user.to_owned(), token: zeroize::Zeroizing::new(token.to_owned()) })
    }

    /// The token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

/// The sandboxes the proxy serves, by name.
#[derive(Debug, Default)]
pub struct Identities {
    by_name: RwLock<HashMap<String, Identity>>,
    /// Whether a full list has been loaded (until then the proxy is not ready).
    synced: std::sync::atomic::AtomicBool,
}

/// Why a client was not recognised (the label goes to the log and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No `Proxy-Authorization: Basic` credential.
    Missing,
    /// No sandbox of that name on this node.
    UnknownSandbox,
    /// The sandbox exists but the connection came from another address.
    WrongAddress,
    /// The token does not match.
    WrongToken,
    /// The sandbox's profile is not in the policy.
    UnknownProfile,
}

impl AuthError {
    /// A stable label for logs and metrics.
    pub fn as_label(self) -> &'static str {
        match self {
            Self::Missing => "proxy_auth_missing",
            Self::UnknownSandbox => "proxy_auth_unknown_sandbox",
            Self::WrongAddress => "proxy_auth_wrong_address",
            Self::WrongToken => "proxy_auth_wrong_token",
            Self::UnknownProfile => "proxy_auth_unknown_profile",
        }
    }

    /// What the client is told.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Missing => {
                "this proxy needs the sandbox's credentials in the proxy URL (http://NAME:TOKEN@HOST:PORT)"
            }
            Self::UnknownSandbox | Self::WrongAddress | Self::WrongToken => {
                "the proxy credentials are not valid for this sandbox"
            }
            Self::UnknownProfile => "the sandbox's profile is not in the proxy's policy",
        }
    }
}

impl Identities {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the whole table (after a full list of pods).
    pub fn replace_all(&self, all: impl IntoIterator<Item = Identity>) {
        let map = all.into_iter().map(|i| (i.sandbox.clone(), i)).collect();
        *self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner) = map;
        self.synced.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether a full list has been loaded: `/readyz` says not ready until then.
    pub fn is_synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Adds or replaces one sandbox.
    pub fn insert(&self, identity: Identity) {
        let mut map = self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(identity.sandbox.clone(), identity);
    }

    /// Forgets one sandbox (its pod was deleted: its address may be reused by another pod).
    pub fn remove(&self, sandbox: &str) {
        self.by_name.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(sandbox);
    }

    /// How many sandboxes are known.
    pub fn len(&self) -> usize {
        self.by_name.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Whether no sandbox is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The profile of the sandbox `user` connecting from `client` with `token`.
    pub fn check(&self, client: IpAddr, user: &str, token: &str) -> Result<String, AuthError> {
        let map = self.by_name.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = map.get(user).ok_or(AuthError::UnknownSandbox)?;
        if canonical(id.addr) != canonical(client) {
            return Err(AuthError::WrongAddress);
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        // Both sides are fixed-length digests, so comparing them leaks nothing about the token.
        if digest.as_ref() != id.token_sha256 {
            return Err(AuthError::WrongToken);
        }
        Ok(id.profile.clone())
    }
}

/// An IPv4-mapped IPv6 address as IPv4 (dual-stack listeners report clients that way).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses a hex SHA-256 (64 hex digits).
pub fn parse_sha256_hex(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> [u8; 32] {
        let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        d.as_ref().try_into().unwrap()
    }

    #[test]
    fn both_address_and_token_must_match() {
        let ids = Identities::new();
        let addr: IpAddr = "10.244.1.7".parse().unwrap();
        ids.insert(Identity { sandbox: "sbx-a".into(), addr, token_sha256: sha("t"), profile: "ci".into() });
        assert_eq!(ids.check(addr, "sbx-a", "t"), Ok("ci".into()));
        assert_eq!(ids.check("::ffff:10.244.1.7".parse().unwrap(), "sbx-a", "t"), Ok("ci".into()));
        assert_eq!(ids.check("10.244.1.8".parse().unwrap(), "sbx-a", "t"), Err(AuthError::WrongAddress));
        assert_eq!(ids.check(addr, "sbx-a", "u"), Err(AuthError::WrongToken));
        assert_eq!(ids.check(addr, "sbx-b", "t"), Err(AuthError::UnknownSandbox));
        ids.remove("sbx-a");
        assert_eq!(ids.check(addr, "sbx-a", "t"), Err(AuthError::UnknownSandbox));
    }

    #[test]
    fn basic_credentials_parse_and_never_print_the_token() {
        use base64::Engine;
        let header = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        let c = Credential::from_basic(&header("sbx-a1:s3cr3t-t0ken")).unwrap();
        assert_eq!((c.user.as_str(), c.token()), ("sbx-a1", "s3cr3t-t0ken"));
        assert!(!format!("{c:?}").contains("s3cr3t"), "{c:?}");
        assert_eq!(Credential::from_basic(&header("sbx-a1")).unwrap().token(), "");
        for bad in [header(":t"), header("a b:t"), header(&"x".repeat(129)), "Bearer abc".into(), "Basic !!!".into()] {
            assert!(Credential::from_basic(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn hex_digests_parse() {
        let hex: String = sha("t").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_sha256_hex(&hex), Some(sha("t")));
        assert_eq!(parse_sha256_hex("zz"), None);
    }
}
