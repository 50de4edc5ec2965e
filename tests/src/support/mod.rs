//! Builders for end-to-end tests: a per-test PKI, origins on port 0, the proxy process, curl,
//! git, and (as root) network namespaces.

pub(crate) mod git;
pub(crate) mod k8s;
pub(crate) mod kube_api;
pub(crate) mod netns;
pub(crate) mod origin;
pub(crate) mod pki;
pub(crate) mod proxy;

use std::process::Command;

/// Clears the proxy variables a machine may preset, so a client goes only where its test says.
pub(crate) fn without_preset_proxies(c: &mut Command) -> &mut Command {
    for var in ["http_proxy", "https_proxy", "HTTPS_PROXY", "ALL_PROXY", "no_proxy", "NO_PROXY"] {
        c.env_remove(var);
    }
    c
}

/// Runs curl with `args` and returns (HTTP status or 0, stdout, stderr). CA variables preset
/// on the machine are cleared so each test's own CA is the only one trusted.
pub(crate) fn curl(args: &[&str]) -> (u16, String, String) {
    let out = without_preset_proxies(&mut Command::new("curl"))
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .env_remove("CURL_CA_BUNDLE")
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
