//! Builders for end-to-end tests: a per-test PKI, origins on port 0, the proxy process, curl,
//! git, and (as root) network namespaces.

pub(crate) mod git;
pub(crate) mod netns;
pub(crate) mod origin;
pub(crate) mod pki;
pub(crate) mod proxy;

use std::process::Command;

/// Runs curl with `args` and returns (HTTP status or 0, stdout, stderr). CA variables preset
/// on the machine are cleared so each test's own CA is the only one trusted.
pub(crate) fn curl(args: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .env_remove("CURL_CA_BUNDLE")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("no_proxy")
        .env_remove("NO_PROXY")
        .args(["-s", "-S", "--max-time", "10", "-w", "\n%{http_code} %{http_connect}"])
        .args(args)
        .output()
        .expect("curl is installed (the README's set-up installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    // A refused CONNECT has no final response: its status is the CONNECT's.
    let mut codes = code.split(' ').filter_map(|c| c.trim().parse::<u16>().ok()).filter(|c| *c != 0);
    (codes.next().unwrap_or(0), body.to_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}
