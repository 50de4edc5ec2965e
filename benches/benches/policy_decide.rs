//! Cost of a policy decision on the hot path: host lookups by suffix, CIDR checks, and
//! vetting resolved addresses, against the shipped coding-agent policy.
#![expect(clippy::unwrap_used, reason = "a benchmark of fixed inputs")]

mod timing;

use std::net::IpAddr;

use sandgate_policy::{CompiledPolicy, Host};

fn main() {
    let src = include_str!("../../deploy/policies/coding-agent.yaml");
    let policy = CompiledPolicy::from_yaml("coding-agent.yaml", src).unwrap();
    let client: IpAddr = "10.0.0.2".parse().unwrap();
    let profile = policy.select_profile(client, None);
    let allowed = Host::parse("objects.githubusercontent.com").unwrap();
    let exact = Host::parse("github.com").unwrap();
    let denied = Host::parse("a.b.c.evil.example").unwrap();
    let literal = Host::parse("140.82.112.3").unwrap();
    let addrs: [IpAddr; 2] = ["10.0.0.9".parse().unwrap(), "140.82.112.3".parse().unwrap()];

    timing::bench("select_profile", || policy.select_profile(client, None));
    timing::bench("decide exact host", || policy.decide(profile, &exact, 443));
    timing::bench("decide wildcard host", || policy.decide(profile, &allowed, 443));
    timing::bench("decide unknown 5-label host", || policy.decide(profile, &denied, 443));
    timing::bench("decide ip literal", || policy.decide(profile, &literal, 443));
    let d = policy.decide(profile, &exact, 443);
    timing::bench("vet 2 addresses (first private)", || policy.vet(&d, &addrs, 443));
    timing::bench("Host::parse (ascii, normalise)", || Host::parse("Objects.GitHubUserContent.com."));
}
