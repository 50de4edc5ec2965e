//! Cost the node agent adds to each explicit-proxy request: finding the sandbox by name,
//! comparing its pod address, and hashing the presented token (SHA-256), with 10,000 sandboxes
//! known (far more than one node runs), and while the watch replaces the table.
#![expect(clippy::unwrap_used, reason = "a benchmark of fixed inputs")]

mod timing;

use std::net::{IpAddr, Ipv4Addr};

use sandgate_proxy::identity::{Identities, Identity};

fn sha(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().try_into().unwrap()
}

fn main() {
    let ids = Identities::new();
    let all: Vec<Identity> = (0..10_000u32)
        .map(|i| Identity {
            sandbox: format!("sbx-{i:06x}"),
            addr: IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i)),
            token_sha256: sha(&format!("{i:032x}")),
            profile: "default".into(),
        })
        .collect();
    ids.replace_all(all.clone());
    let addr = IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + 4242));
    let token = format!("{:032x}", 4242);
    timing::bench("check: known sandbox, right token (10k known)", || ids.check(addr, "sbx-001092", &token).unwrap());
    timing::bench("check: known sandbox, wrong token", || ids.check(addr, "sbx-001092", "x").unwrap_err());
    timing::bench("check: unknown sandbox", || ids.check(addr, "sbx-ffffff", &token).unwrap_err());
    timing::bench("replace_all: 10k sandboxes (a full relist)", || ids.replace_all(all.clone()));
}
