//! Attaching a sandbox at birth: its network namespace, a veth to the gateway side, addresses
//! and a default route via the gateway, then the `sandgate` table loaded on the gateway side.
//! Commands go through [`Run`], so the sequence is testable as data and each step that fails
//! says which command and why.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::rules::{AttachConfig, SandboxLink};

/// Runs a program with arguments (and optional standard input) and returns its standard output.
pub trait Run {
    /// Runs `program args...`; an exit status other than 0 is an error carrying stderr.
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, AttachError>;
}

/// Runs real commands (`ip`, `nft`).
#[derive(Debug, Default)]
pub struct System;

/// Why attaching failed.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// A command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr (or why it did not start).
        stderr: String,
    },
    /// An interface name longer than the kernel allows.
    #[error("interface name `{0}` is longer than 15 bytes")]
    InterfaceName(String),
}

/// A sandbox's attachment, to detach later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// The sandbox's network namespace (under /run/netns).
    pub netns: String,
    /// The sandbox-side interface.
    pub sandbox_if: String,
    /// The link as the ruleset sees it.
    pub link: SandboxLink,
}

impl Run for System {
    fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, AttachError> {
        let command = format!("{program} {}", args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| AttachError::Command { command: command.clone(), stderr: e.to_string() })?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .map_err(|e| AttachError::Command { command: command.clone(), stderr: e.to_string() })?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| AttachError::Command { command: command.clone(), stderr: e.to_string() })?;
        if !out.status.success() {
            return Err(AttachError::Command {
                command,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `ip [-n NS] args...` as program and arguments.
fn ip<'a>(ns: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = Vec::with_capacity(args.len() + 2);
    if let Some(ns) = ns {
        v.extend(["-n", ns]);
    }
    v.extend_from_slice(args);
    v
}

/// Creates the sandbox namespace `netns` and its veth (sandbox side `sandbox_if`, gateway side
/// `link.gateway_if` in `gateway_ns`, or the current namespace when `None`), with addresses on
/// a /30 and the gateway as default route.
pub fn attach(
    run: &mut impl Run,
    gateway_ns: Option<&str>,
    netns: &str,
    sandbox_if: &str,
    link: &SandboxLink,
) -> Result<Attached, AttachError> {
    for name in [sandbox_if, link.gateway_if.as_str()] {
        if name.len() > 15 {
            return Err(AttachError::InterfaceName(name.to_owned()));
        }
    }
    let sbx = Some(netns);
    let gw_addr = format!("{}/30", link.gateway_addr);
    let sbx_addr = format!("{}/30", link.sandbox_addr);
    let gateway = link.gateway_addr.to_string();
    run.run("ip", &["netns", "add", netns], None)?;
    let mut add = vec!["link", "add", sandbox_if, "netns", netns, "type", "veth", "peer", "name", &link.gateway_if];
    if let Some(gw) = gateway_ns {
        add.extend(["netns", gw]);
    }
    run.run("ip", &add, None)?;
    run.run("ip", &ip(sbx, &["addr", "add", &sbx_addr, "dev", sandbox_if]), None)?;
    run.run("ip", &ip(gateway_ns, &["addr", "add", &gw_addr, "dev", &link.gateway_if]), None)?;
    run.run("ip", &ip(sbx, &["link", "set", "lo", "up"]), None)?;
    run.run("ip", &ip(sbx, &["link", "set", sandbox_if, "up"]), None)?;
    run.run("ip", &ip(gateway_ns, &["link", "set", &link.gateway_if, "up"]), None)?;
    run.run("ip", &ip(sbx, &["route", "add", "default", "via", &gateway]), None)?;
    Ok(Attached { netns: netns.to_owned(), sandbox_if: sandbox_if.to_owned(), link: link.clone() })
}

/// Loads the ruleset for `config` on the gateway side (replacing any previous `sandgate` table
/// in one transaction).
pub fn apply_rules(run: &mut impl Run, gateway_ns: Option<&str>, config: &AttachConfig) -> Result<(), AttachError> {
    let ruleset = config.render();
    match gateway_ns {
        Some(ns) => run.run("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&ruleset)),
        None => run.run("nft", &["-f", "-"], Some(&ruleset)),
    }
    .map(|_| ())
}

/// Removes a table (a sandbox's own); a table that is already gone is not an error.
pub fn remove_table(run: &mut impl Run, gateway_ns: Option<&str>, table: &str) -> Result<(), AttachError> {
    let script = format!("add table inet {table}\ndelete table inet {table}\n");
    match gateway_ns {
        Some(ns) => run.run("ip", &["netns", "exec", ns, "nft", "-f", "-"], Some(&script)),
        None => run.run("nft", &["-f", "-"], Some(&script)),
    }
    .map(|_| ())
}

/// Removes the sandbox's namespace, which also removes its veth, routes and conntrack entries.
pub fn detach(run: &mut impl Run, attached: &Attached) -> Result<(), AttachError> {
    run.run("ip", &["netns", "del", &attached.netns], None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records commands instead of running them.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl Run for Recorder {
        fn run(&mut self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, AttachError> {
            let mut line = format!("{program} {}", args.join(" "));
            if let Some(s) = stdin {
                line.push_str(&format!(" <<{} bytes", s.len()));
            }
            self.0.push(line);
            Ok(String::new())
        }
    }

    #[test]
    fn attach_runs_the_expected_commands_in_order() {
        let link = SandboxLink {
            gateway_if: "sgg-a1".into(),
            gateway_addr: "10.213.0.1".parse().unwrap(),
            sandbox_addr: "10.213.0.2".parse().unwrap(),
        };
        let mut r = Recorder::default();
        let a = attach(&mut r, Some("gw"), "sbx-a1", "sgs-a1", &link).unwrap();
        detach(&mut r, &a).unwrap();
        assert_eq!(
            r.0,
            [
                "ip netns add sbx-a1",
                "ip link add sgs-a1 netns sbx-a1 type veth peer name sgg-a1 netns gw",
                "ip -n sbx-a1 addr add 10.213.0.2/30 dev sgs-a1",
                "ip -n gw addr add 10.213.0.1/30 dev sgg-a1",
                "ip -n sbx-a1 link set lo up",
                "ip -n sbx-a1 link set sgs-a1 up",
                "ip -n gw link set sgg-a1 up",
                "ip -n sbx-a1 route add default via 10.213.0.1",
                "ip netns del sbx-a1",
            ]
        );
        assert!(matches!(
            attach(&mut Recorder::default(), None, "n", "an-interface-name-too-long", &link),
            Err(AttachError::InterfaceName(_))
        ));
    }
}
