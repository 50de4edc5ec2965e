//! The `sandgate` command line: policy check and explain, and a proxy that refuses bad flags,
//! bad policies and busy addresses before it listens, each with its exit status and message.

use std::process::Command;

use crate::support::proxy::sandgate_bin;

fn sandgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(sandgate_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn policy_check_accepts_good_files_and_explains_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "version: 1\nallow:\n  - hosts: [github.com]\n").unwrap();
    let (code, out, _) = sandgate(&["policy", "check", good.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out.contains("good.yaml: ok (1 profile: default)"), "{out}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: 1\nallow:\n  - hosts: [\"*github.com\"]\n").unwrap();
    let (code, _, err) = sandgate(&["policy", "check", bad.to_str().unwrap()]);
    assert_eq!(code, 65);
    assert!(
        err.contains("bad.yaml:3:13: allow[0].hosts[0]: `*github.com`: a wildcard must be a whole leading label"),
        "{err}"
    );

    let (code, _, err) = sandgate(&["policy", "check", dir.path().join("missing.yaml").to_str().unwrap()]);
    assert_eq!(code, 65);
    assert!(err.contains("cannot read policy") && err.contains("missing.yaml"), "{err}");

    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/policies/coding-agent.yaml");
    assert_eq!(sandgate(&["policy", "check", shipped]).0, 0);
}

#[test]
fn policy_explain_prints_the_decision() {
    let (code, out, _) = sandgate(&["policy", "explain", "-", "github.com:443"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verdict:     allow") && out.contains("rule:        git-hosts"), "{out}");
    let (code, out, _) = sandgate(&["policy", "explain", "-", "example.com:443"]);
    assert_eq!(code, 1);
    assert!(out.contains("reason:      host_not_allowed (no rule allows this host)"), "{out}");
    let (code, out, _) = sandgate(&["policy", "explain", "-", "github.com:22"]);
    assert_eq!(code, 1);
    assert!(out.contains("port_not_allowed"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(&p, "version: 1\nresolve:\n  meta.test: [169.254.169.254]\nallow:\n  - hosts: [meta.test]\n")
        .unwrap();
    let (code, out, _) = sandgate(&["policy", "explain", p.to_str().unwrap(), "meta.test:443"]);
    assert_eq!(code, 1);
    assert!(out.contains("address_metadata"), "{out}");
    let (code, _, err) = sandgate(&["policy", "explain", "-", "no-port"]);
    assert_eq!(code, 64);
    assert!(err.contains("write HOST:PORT"), "{err}");
}

#[test]
fn proxy_refuses_bad_input_before_listening() {
    let (code, _, err) = sandgate(&["proxy", "--listen", "not-an-address"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--listen"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: 1\nallow:\n  - hosts: [\"*.com\"]\n").unwrap();
    let (code, _, err) = sandgate(&["proxy", "--policy", bad.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 65);
    assert!(err.contains("bad.yaml:3:13") && err.contains("whole top-level domain"), "{err}");
    assert!(!err.contains("listening"), "nothing may listen with a bad policy: {err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let (code, _, err) = sandgate(&["proxy", "--listen", &addr, "--no-transparent", "--no-admin"]);
    assert_eq!(code, 69);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");

    let (code, out, _) = sandgate(&["proxy", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("embedded default") && out.contains("SANDGATE_LISTEN"), "{out}");
}

#[test]
fn secrets_are_set_from_stdin_listed_by_name_and_never_printed() {
    use std::io::Write;
    const CANARY: &str = "ghp_CANARY0123456789abcdefABCDEF0123456789";
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("vault.json");
    let key = dir.path().join("vault.key");
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut c = Command::new(sandgate_bin());
        c.arg("secret")
            .args(args)
            .arg("--vault")
            .arg(&vault)
            .arg("--key-file")
            .arg(&key)
            .env_remove("SANDGATE_VAULT_KEY");
        c.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, out) = run(&["set", "github-token"], Some(&format!("{CANARY}\n")));
    assert_eq!(code, 0, "{out}");
    let (code, listed) = run(&["list"], None);
    assert_eq!((code, listed.trim()), (0, "github-token"));
    let (code, empty) = run(&["set", "empty"], Some(""));
    assert_eq!(code, 64, "{empty}");
    let (code, bad) = run(&["set", "bad name"], Some("x"));
    assert_eq!(code, 74);
    assert!(bad.contains("not a secret name"), "{bad}");
    for text in [&out, &listed, &empty, &bad, &std::fs::read_to_string(&vault).unwrap()] {
        assert!(!text.contains(CANARY), "the canary leaked: {text}");
    }
    // A different key: the vault opens, but the secret does not (clear error, no garbage).
    let (code, _) = run(&["rm", "github-token"], None);
    assert_eq!(code, 0);
    let (code, missing) = run(&["rm", "github-token"], None);
    assert_eq!(code, 74);
    assert!(missing.contains("no secret named `github-token`"), "{missing}");
    let other = Command::new(sandgate_bin())
        .args(["secret", "list", "--key-file"])
        .arg(dir.path().join("absent.key"))
        .arg("--vault")
        .arg(&vault)
        .env_remove("SANDGATE_VAULT_KEY")
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(74));
    assert!(String::from_utf8_lossy(&other.stderr).contains("no vault key at"));
}

#[test]
fn the_proxy_process_cannot_write_core_files() {
    let p = crate::support::proxy::new("version: 1\n").start();
    let status = std::fs::read_to_string(format!("/proc/{}/limits", p.pid())).unwrap();
    let core = status.lines().find(|l| l.starts_with("Max core file size")).unwrap().to_owned();
    assert!(core.split_whitespace().filter(|w| *w == "0").count() >= 2, "core dumps still allowed: {core}");
}
