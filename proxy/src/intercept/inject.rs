//! Putting a credential on a request: pure over the request's headers. Whatever credential the
//! sandbox sent is removed first, so only Sandgate's reaches the origin.

use base64::Engine;
use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue, PROXY_AUTHORIZATION};
use sandgate_policy::Apply;
use sandgate_vault::Secret;
use zeroize::Zeroizing;

/// Why a credential could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The secret holds bytes that cannot go in a header (a newline, say).
    #[error("the secret `{0}` cannot be written in an HTTP header (it holds control characters)")]
    NotHeaderSafe(String),
}

/// Removes any credential the sandbox sent and adds the secret as `apply` says.
pub fn inject(
    headers: &mut HeaderMap,
    apply: &Apply,
    secret_name: &str,
    secret: &Secret<Vec<u8>>,
) -> Result<(), InjectError> {
    headers.remove(AUTHORIZATION);
    headers.remove(PROXY_AUTHORIZATION);
    let bad = || InjectError::NotHeaderSafe(secret_name.to_owned());
    let (name, value) = match apply {
        Apply::Basic { username } => {
            let mut plain = Zeroizing::new(Vec::with_capacity(username.len() + 1 + secret.expose().len()));
            plain.extend_from_slice(username.as_bytes());
            plain.push(b':');
            plain.extend_from_slice(secret.expose());
            let encoded =
                Zeroizing::new(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(&*plain)));
            (AUTHORIZATION, HeaderValue::from_str(&encoded).map_err(|_| bad())?)
        }
        Apply::Bearer => {
            let mut v = Zeroizing::new(b"Bearer ".to_vec());
            v.extend_from_slice(secret.expose());
            (AUTHORIZATION, HeaderValue::from_bytes(&v).map_err(|_| bad())?)
        }
        Apply::Header { name } => {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            headers.remove(&name);
            (name, HeaderValue::from_bytes(secret.expose()).map_err(|_| bad())?)
        }
    };
    let mut value = value;
    // Keeps the value out of HTTP/2 header compression tables (HPACK "never indexed").
    value.set_sensitive(true);
    headers.insert(name, value);
    Ok(())
}

/// Whether `placeholder` appears in any header, including inside a Basic credential (git sends
/// `user:password` base64-encoded).
pub fn carries(headers: &HeaderMap, placeholder: &str) -> bool {
    headers.values().any(|v| {
        let bytes = v.as_bytes();
        if contains(bytes, placeholder.as_bytes()) {
            return true;
        }
        let text = String::from_utf8_lossy(bytes);
        let Some(b64) = text.strip_prefix("Basic ").or_else(|| text.strip_prefix("basic ")) else { return false };
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .is_ok_and(|plain| contains(&Zeroizing::new(plain), placeholder.as_bytes()))
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret<Vec<u8>> {
        Secret::new(b"ghp_realtoken".to_vec())
    }

    #[test]
    fn basic_replaces_whatever_the_sandbox_sent() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic c2FuZGJveDpmYWtl"));
        h.insert(PROXY_AUTHORIZATION, HeaderValue::from_static("Basic eDp5"));
        inject(&mut h, &Apply::Basic { username: "x-access-token".into() }, "t", &secret()).unwrap();
        let expected =
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("x-access-token:ghp_realtoken"));
        assert_eq!(h.get_all(AUTHORIZATION).iter().count(), 1);
        assert_eq!(h[AUTHORIZATION], expected.as_str());
        assert!(h[AUTHORIZATION].is_sensitive());
        assert!(h.get(PROXY_AUTHORIZATION).is_none());
    }

    #[test]
    fn bearer_and_named_header() {
        let mut h = HeaderMap::new();
        inject(&mut h, &Apply::Bearer, "t", &secret()).unwrap();
        assert_eq!(h[AUTHORIZATION], "Bearer ghp_realtoken");
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("sandbox-value"));
        inject(&mut h, &Apply::Header { name: "x-api-key".into() }, "t", &secret()).unwrap();
        assert_eq!(h["x-api-key"], "ghp_realtoken");
        assert_eq!(h.get_all("x-api-key").iter().count(), 1);
    }

    #[test]
    fn secrets_that_break_headers_are_refused() {
        let mut h = HeaderMap::new();
        let bad = Secret::new(b"line\nbreak".to_vec());
        assert!(inject(&mut h, &Apply::Bearer, "t", &bad).is_err());
    }

    #[test]
    fn placeholders_are_found_in_headers_and_basic_credentials() {
        let ph = "ghp_PLACEHOLDER_0000000000";
        let mut h = HeaderMap::new();
        h.insert("x-token", HeaderValue::from_static("ghp_PLACEHOLDER_0000000000"));
        assert!(carries(&h, ph));
        let mut h = HeaderMap::new();
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("x:{ph}")));
        h.insert(AUTHORIZATION, HeaderValue::from_str(&basic).unwrap());
        assert!(carries(&h, ph));
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer something-else"));
        assert!(!carries(&h, ph));
    }
}
