//! Decision tables for the compiled policy: each case names what it checks.

use std::net::IpAddr;

use crate::{CompiledPolicy, Host, Mode, Reason, Verdict, embedded_default};

const POLICY: &str = r#"
version: 1
resolve:
  git.test: [127.0.0.1]
  meta.test: [169.254.169.254]
  mixed.test: [10.0.0.1, 93.184.216.34]
allow:
  - name: github
    hosts: [github.com, "*.githubusercontent.com"]
  - name: gitlab-all
    hosts: ["**.gitlab.com"]
  - name: ssh-github
    hosts: [github.com]
    ports: [22]
  - name: internal-db
    cidrs: [10.20.0.0/16]
    ports: [5432]
  - name: loopback-test
    cidrs: [127.0.0.0/8]
    ports: [8080]
  - name: git-test
    hosts: [git.test, meta.test, mixed.test]
    ports: [8080, 443]
deny:
  - name: no-gist
    hosts: [gist.github.com, "*.evil.githubusercontent.com"]
  - name: no-db-admin
    cidrs: [10.20.9.0/24]
profiles:
  ci:
    match:
      sources: [10.200.0.0/24]
    mode: report
    allow:
      - hosts: [pypi.org]
  sbx-7:
    match:
      users: [sbx-7]
      sources: [10.200.0.0/16]
    allow:
      - hosts: [crates.io]
"#;

fn policy() -> CompiledPolicy {
    CompiledPolicy::from_yaml("t.yaml", POLICY).unwrap()
}

fn host(s: &str) -> Host {
    Host::parse(s).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn host_decisions() {
    let p = policy();
    let d = p.select_profile(ip("192.0.2.1"), None);
    // (case, host, port, verdict, reason, rule)
    type Case<'a> = (&'a str, &'a str, u16, Verdict, Reason, Option<&'a str>);
    let cases: &[Case<'_>] = &[
        ("exact host", "github.com", 443, Verdict::Allow, Reason::HostAllowed, Some("github")),
        ("exact host, case and dot", "GitHub.com.", 80, Verdict::Allow, Reason::HostAllowed, Some("github")),
        ("apex not covered by *.", "githubusercontent.com", 443, Verdict::Deny, Reason::HostNotAllowed, None),
        ("subdomain by *.", "raw.githubusercontent.com", 443, Verdict::Allow, Reason::HostAllowed, Some("github")),
        ("apex by **.", "gitlab.com", 443, Verdict::Allow, Reason::HostAllowed, Some("gitlab-all")),
        ("deep subdomain by **.", "a.b.gitlab.com", 443, Verdict::Allow, Reason::HostAllowed, Some("gitlab-all")),
        ("glued name is not a subdomain", "evilgitlab.com", 443, Verdict::Deny, Reason::HostNotAllowed, None),
        ("second rule opens a port", "github.com", 22, Verdict::Allow, Reason::HostAllowed, Some("ssh-github")),
        ("port not allowed", "github.com", 8443, Verdict::Deny, Reason::PortNotAllowed, Some("github")),
        ("deny beats allow", "gist.github.com", 443, Verdict::Deny, Reason::HostDenied, Some("no-gist")),
        (
            "deny beats a broader allow",
            "x.evil.githubusercontent.com",
            443,
            Verdict::Deny,
            Reason::HostDenied,
            Some("no-gist"),
        ),
        ("unknown host", "evil.example", 443, Verdict::Deny, Reason::HostNotAllowed, None),
        ("ip literal without cidr", "140.82.112.3", 443, Verdict::Deny, Reason::IpNotAllowed, None),
        ("ip literal with cidr", "10.20.1.1", 5432, Verdict::Allow, Reason::CidrAllowed, Some("internal-db")),
        ("ip literal wrong port", "10.20.1.1", 22, Verdict::Deny, Reason::PortNotAllowed, Some("internal-db")),
        ("cidr deny beats allow", "10.20.9.9", 5432, Verdict::Deny, Reason::CidrDenied, Some("no-db-admin")),
        ("bracketed ipv6 literal", "[2001:db8::1]", 443, Verdict::Deny, Reason::IpNotAllowed, None),
    ];
    for (case, h, port, verdict, reason, rule) in cases {
        let got = p.decide(d, &host(h), *port);
        assert_eq!((got.verdict, got.reason), (*verdict, *reason), "{case}");
        assert_eq!(got.rule.map(|r| p.rule_name(r)), *rule, "{case}: rule");
    }
}

#[test]
fn deny_rule_on_exact_name_is_reported() {
    let p = policy();
    let d = p.decide(p.select_profile(ip("192.0.2.1"), None), &host("gist.github.com"), 443);
    // gist.github.com is not under any allow rule, but the deny rule still matches first.
    assert_eq!(d.reason, Reason::HostDenied);
    assert_eq!(d.rule.map(|r| p.rule_name(r)), Some("no-gist"));
}

#[test]
fn addresses_are_vetted_after_resolution() {
    let p = policy();
    let prof = p.select_profile(ip("192.0.2.1"), None);
    // (case, host, resolved addresses, port, dialled address or denial reason)
    type Case<'a> = (&'a str, &'a str, &'a [&'a str], u16, Result<&'a str, Reason>);
    let cases: &[Case<'_>] = &[
        ("public address passes", "github.com", &["140.82.112.3"], 443, Ok("140.82.112.3:443")),
        ("metadata refused", "meta.test", &["169.254.169.254"], 443, Err(Reason::Address(crate::AddrClass::Metadata))),
        (
            "private refused without cidr",
            "github.com",
            &["10.0.0.1"],
            443,
            Err(Reason::Address(crate::AddrClass::Private)),
        ),
        ("first good address wins", "mixed.test", &["10.0.0.1", "93.184.216.34"], 443, Ok("93.184.216.34:443")),
        ("loopback opened by cidr allow", "git.test", &["127.0.0.1"], 8080, Ok("127.0.0.1:8080")),
        (
            "loopback cidr allow is port-scoped",
            "git.test",
            &["127.0.0.1"],
            443,
            Err(Reason::Address(crate::AddrClass::Loopback)),
        ),
        ("no addresses", "github.com", &[], 443, Err(Reason::Unresolvable)),
        ("cidr deny on resolved address", "github.com", &["10.20.9.1"], 443, Err(Reason::CidrDenied)),
    ];
    for (case, h, addrs, port, want) in cases {
        let d = p.decide(prof, &host(h), *port);
        assert!(d.verdict.proceeds(), "{case}: host decision {d:?}");
        let addrs: Vec<IpAddr> = addrs.iter().map(|a| ip(a)).collect();
        let got = p.vet(&d, &addrs, *port).map(|permit| permit.upstream().to_string()).map_err(|d| d.reason);
        assert_eq!(got.as_deref().map_err(|r| *r), want.as_ref().map(|s| *s).map_err(|r| *r), "{case}");
    }
}

#[test]
fn profiles_select_by_source_and_user() {
    let p = policy();
    let name = |src: &str, user: Option<&str>| p.profile_name(p.select_profile(ip(src), user)).to_owned();
    assert_eq!(name("192.0.2.1", None), "default", "unknown source");
    assert_eq!(name("10.200.0.5", None), "ci", "source cidr");
    assert_eq!(name("10.200.0.5", Some("sbx-7")), "sbx-7", "user beats source");
    assert_eq!(name("10.200.9.5", Some("sbx-7")), "sbx-7", "user with wider source");
    assert_eq!(name("192.0.2.1", Some("sbx-7")), "default", "user from outside its sources is not trusted");
    assert_eq!(name("10.200.9.5", Some("other")), "default", "unknown user");
}

#[test]
fn report_mode_lets_denials_through_as_report() {
    let p = policy();
    let ci = p.select_profile(ip("10.200.0.5"), None);
    let d = p.decide(ci, &host("evil.example"), 443);
    assert_eq!((d.verdict, d.reason, d.mode), (Verdict::Report, Reason::HostNotAllowed, Mode::Report));
    let permit = p.vet(&d, &[ip("93.184.216.34")], 443).unwrap();
    assert_eq!(permit.decision().verdict, Verdict::Report);
    // An allowed host resolving to a refused class is reported, not refused.
    let d = p.decide(ci, &host("pypi.org"), 443);
    assert_eq!(d.verdict, Verdict::Allow);
    let permit = p.vet(&d, &[ip("169.254.169.254")], 443).unwrap();
    assert_eq!(permit.decision().reason, Reason::Address(crate::AddrClass::Metadata));
    assert_eq!(permit.decision().verdict, Verdict::Report);
}

#[test]
fn protocol_refusals_follow_the_mode() {
    let p = policy();
    let d = p.refuse(p.select_profile(ip("192.0.2.1"), None), Reason::SniMismatch);
    assert_eq!(d.verdict, Verdict::Deny);
    let d = p.refuse(p.select_profile(ip("10.200.0.5"), None), Reason::SniMismatch);
    assert_eq!(d.verdict, Verdict::Report);
}

#[test]
fn embedded_default_is_the_seed_allowlist() {
    let p = embedded_default().unwrap();
    let d = p.select_profile(ip("127.0.0.1"), None);
    for h in ["github.com", "gitlab.com", "bitbucket.org", "registry.npmjs.org", "pypi.org"] {
        assert_eq!(p.decide(d, &host(h), 443).verdict, Verdict::Allow, "{h}");
    }
    for h in ["api.github.com", "example.com", "files.pythonhosted.org"] {
        assert_eq!(p.decide(d, &host(h), 443).verdict, Verdict::Deny, "{h}");
    }
}

#[test]
fn static_resolve_entries_are_normalised() {
    let p = CompiledPolicy::from_yaml("t", "version: 1\nresolve:\n  Git.Test.: [127.0.0.1, '::1']\n").unwrap();
    let name = crate::HostName::parse("git.test").unwrap();
    assert_eq!(p.static_addrs(&name).unwrap(), &[ip("127.0.0.1"), ip("::1")]);
}

/// The shipped coding-agent policy parses and opens exactly what git, npm, pip and cargo use.
#[test]
fn coding_agent_policy_opens_the_package_managers_hosts() {
    let src = include_str!("../../deploy/policies/coding-agent.yaml");
    let p = CompiledPolicy::from_yaml("coding-agent.yaml", src).unwrap();
    let d = p.select_profile(ip("10.0.0.2"), None);
    for h in [
        "github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
        "raw.githubusercontent.com",
        "api.github.com",
        "gitlab.com",
        "bitbucket.org",
        "registry.npmjs.org",
        "registry.yarnpkg.com",
        "pypi.org",
        "files.pythonhosted.org",
        "crates.io",
        "index.crates.io",
        "static.crates.io",
    ] {
        assert_eq!(p.decide(d, &host(h), 443).verdict, Verdict::Allow, "{h}");
        assert_eq!(p.decide(d, &host(h), 80).reason, Reason::PortNotAllowed, "{h} on port 80");
    }
    for h in ["gist.github.com", "gist.githubusercontent.com", "uploads.github.com"] {
        assert_eq!(p.decide(d, &host(h), 443).reason, Reason::HostDenied, "{h}");
    }
    for h in ["evil.example", "githubusercontent.com.evil.example", "pythonhosted.org"] {
        assert_eq!(p.decide(d, &host(h), 443).verdict, Verdict::Deny, "{h}");
    }
    assert!(p.refuses_ech());
}
