//! Kubernetes' own contracts, offline: documents validated against the Kubernetes OpenAPI
//! schemas by `kubernetes-validate --strict` (PyPI; `scripts/setup` installs it in `.venv-k8s`).

use std::path::PathBuf;
use std::process::Command;

/// The Kubernetes version the documents must be valid for (the oldest Sandgate supports:
/// native sidecars are on by default from 1.29 and GA in 1.33).
pub(crate) const KUBERNETES_VERSION: &str = "1.33.0";

/// The validator: `$KUBERNETES_VALIDATE`, else the repository's `.venv-k8s`.
fn validator() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBERNETES_VALIDATE") {
        return p.into();
    }
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv-k8s/bin/kubernetes-validate"));
    assert!(p.exists(), "{} is missing: run scripts/setup (it installs kubernetes-validate)", p.display());
    p
}

/// Validates YAML or JSON documents (several separated by `---`) in strict mode; panics with
/// the validator's findings when any document is invalid.
pub(crate) fn validate(what: &str, documents: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("documents.yaml");
    std::fs::write(&file, documents).unwrap();
    let out =
        Command::new(validator()).args(["--strict", "-k", KUBERNETES_VERSION, "--quiet"]).arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "{what}: not valid for Kubernetes {KUBERNETES_VERSION}:\n{}{}\n{documents}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Multi-document YAML as JSON values (PyYAML from the validator's environment: the tests
/// need no YAML parser of their own).
pub(crate) fn yaml_to_json(yaml: &str) -> Vec<serde_json::Value> {
    use std::io::Write;
    let python = validator().with_file_name("python");
    let mut child = Command::new(python)
        .args(["-c", "import json,sys,yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}
