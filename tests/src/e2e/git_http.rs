//! A real `git clone` and `git push` (smart HTTP over plain http) through the explicit proxy.

use super::loopback_policy;
use crate::support::git::{self, git, ok};
use crate::support::proxy;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clone_and_push_through_the_proxy() {
    let server = git::server().await;
    let port = server.addr.port();
    let p = proxy::new(&loopback_policy(&[port])).start();
    let work = tempfile::tempdir().unwrap();
    let proxy_env = [("http_proxy", p.url())];
    let env: Vec<(&str, &str)> = proxy_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let url = format!("http://git.test:{port}/repo.git");

    let out = git(work.path(), &["clone", "-q", &url, "clone"], &env);
    ok(&out, "clone through the proxy");
    let readme = std::fs::read_to_string(work.path().join("clone/README")).unwrap();
    assert_eq!(readme, "hello from the origin\n");

    let clone = work.path().join("clone");
    std::fs::write(clone.join("work.txt"), "work in progress\n").unwrap();
    ok(&git(&clone, &["add", "work.txt"], &env), "add");
    ok(&git(&clone, &["commit", "-q", "-m", "agent work"], &env), "commit");
    ok(&git(&clone, &["push", "-q", "origin", "main"], &env), "push through the proxy");
    let log = git(&server.root.path().join("repo.git"), &["log", "--format=%s", "main"], &[]);
    assert_eq!(String::from_utf8_lossy(&log.stdout), "agent work\nfirst\n");

    let receive = p.wait_log("receive-pack", |v| v["path"] == "/repo.git/git-receive-pack");
    assert_eq!(receive["verdict"], "allow");
    assert_eq!(receive["method"], "POST");
    assert!(receive["bytes_up"].as_u64().unwrap() > 0, "{receive}");
    let refs = p.wait_log("info/refs", |v| v["path"] == "/repo.git/info/refs?REDACTED");
    assert_eq!(refs["dst_host"], "git.test");

    // Without the proxy the name does not even resolve: the proxy did the resolving.
    let direct = git(work.path(), &["clone", "-q", &url, "direct"], &[]);
    assert!(!direct.status.success());
    // And a host outside the policy is refused with a reason git shows the user.
    let denied = git(work.path(), &["clone", "-q", &format!("http://evil.example:{port}/repo.git"), "evil"], &env);
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(stderr.contains("403"), "{stderr}");
}
