//! End-to-end tests, one module per area.

mod attach;
mod bad_input;
mod cli;
mod deploy;
mod dns;
mod explicit;
mod git_http;
mod init;
mod intercept;
mod kube;
mod limits;
mod node_agent;
mod reload;
mod run;
mod tls_checks;
mod transparent;
mod webhook;

/// A policy for loopback origins: `origin.test`, `git.test` and `meta.test` (which resolves to
/// the cloud metadata address) are allowed on `ports`; `other.test` resolves but is not
/// allowed; loopback is opened on `ports` only, by a CIDR rule.
pub(crate) fn loopback_policy(ports: &[u16]) -> String {
    let ports = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    format!(
        r#"version: 1
resolve:
  origin.test: [127.0.0.1]
  git.test: [127.0.0.1]
  other.test: [127.0.0.1]
  meta.test: [169.254.169.254]
allow:
  - name: test-origins
    hosts: [origin.test, git.test, meta.test]
    ports: [{ports}]
  - name: loopback-origins
    cidrs: [127.0.0.0/8]
    ports: [{ports}]
deny:
  - name: no-admin-origin
    hosts: [admin.origin.test]
profiles:
  reporting:
    match:
      users: [rollout-1]
    mode: report
    allow:
      - hosts: [origin.test]
        ports: [{ports}]
"#
    )
}
