//! Credential and git rules compiled for the proxy: which hosts are intercepted, which
//! credential a request gets, and whether a git smart-HTTP request may touch its repository.
//! Names of secrets only; values live in the vault.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::host::{HostName, HostPattern};
use crate::rules::{Apply, Credential, GitRule};

/// A git operation, from the smart-HTTP endpoint a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitOp {
    /// `info/refs?service=git-upload-pack` or `POST git-upload-pack`: clone and fetch.
    Fetch,
    /// `info/refs?service=git-receive-pack` or `POST git-receive-pack`: push.
    Push,
}

/// What a git rule says about a request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitVerdict {
    /// Not a smart-HTTP endpoint: git rules do not apply.
    NotGit,
    /// A smart-HTTP endpoint for a repository the rule allows for this operation.
    Allowed {
        /// The operation.
        op: GitOp,
        /// `owner/repo`.
        repo: String,
    },
    /// A smart-HTTP endpoint for a repository the rule does not allow for this operation.
    Denied {
        /// The operation.
        op: GitOp,
        /// `owner/repo`.
        repo: String,
    },
}

/// A credential rule ready to match.
#[derive(Debug)]
pub struct CompiledCredential {
    rule: Credential,
}

/// A git rule ready to match.
#[derive(Debug)]
pub struct CompiledGitRule {
    hosts: Vec<HostPattern>,
    fetch: GlobSet,
    push: GlobSet,
}

// === impl GitOp ===

impl GitOp {
    /// `fetch` or `push`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Push => "push",
        }
    }
}

// === impl CompiledCredential ===

impl CompiledCredential {
    pub(crate) fn new(rule: Credential) -> Self {
        Self { rule }
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.rule.name
    }

    /// The vault secret's name.
    pub fn secret(&self) -> &str {
        &self.rule.secret
    }

    /// How the secret is applied.
    pub fn apply(&self) -> &Apply {
        &self.rule.apply
    }

    /// The placeholder the sandbox may hold, if any.
    pub fn placeholder(&self) -> Option<&str> {
        self.rule.placeholder.as_deref()
    }

    /// Whether the rule covers `host`.
    pub fn covers_host(&self, host: &HostName) -> bool {
        self.rule.hosts.iter().any(|p| p.matches(host))
    }

    /// Whether the rule covers a request to `host` for `path`.
    pub fn covers(&self, host: &HostName, path: &str) -> bool {
        self.covers_host(host) && self.rule.path_prefix.as_deref().is_none_or(|p| path.starts_with(p))
    }
}

// === impl CompiledGitRule ===

impl CompiledGitRule {
    pub(crate) fn new(rule: &GitRule) -> Result<Self, globset::Error> {
        Ok(Self { hosts: rule.hosts.clone(), fetch: globs(&rule.fetch)?, push: globs(&rule.push)? })
    }

    /// Whether the rule covers `host`.
    pub fn covers_host(&self, host: &HostName) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }

    /// Judges a request path and query against the rule.
    pub fn check(&self, path: &str, query: Option<&str>) -> GitVerdict {
        let Some((repo, op)) = smart_http(path, query) else { return GitVerdict::NotGit };
        let set = match op {
            GitOp::Fetch => &self.fetch,
            GitOp::Push => &self.push,
        };
        if set.is_match(&repo) { GitVerdict::Allowed { op, repo } } else { GitVerdict::Denied { op, repo } }
    }
}

/// Compiles `owner/repo` globs; `*` never crosses a `/`, so `org/*` is every repository of
/// `org` and nothing deeper.
pub(crate) fn globs(patterns: &[String]) -> Result<GlobSet, globset::Error> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(GlobBuilder::new(&p.to_ascii_lowercase()).literal_separator(true).build()?);
    }
    b.build()
}

/// The repository (`owner/repo`, lower case, without `.git`) and operation of a git
/// smart-HTTP request, or `None` for any other path.
pub fn smart_http(path: &str, query: Option<&str>) -> Option<(String, GitOp)> {
    let (repo_path, op) = if let Some(p) = path.strip_suffix("/info/refs") {
        let service = query?.split('&').find_map(|kv| kv.strip_prefix("service="))?;
        let op = match service {
            "git-upload-pack" => GitOp::Fetch,
            "git-receive-pack" => GitOp::Push,
            _ => return None,
        };
        (p, op)
    } else if let Some(p) = path.strip_suffix("/git-upload-pack") {
        (p, GitOp::Fetch)
    } else if let Some(p) = path.strip_suffix("/git-receive-pack") {
        (p, GitOp::Push)
    } else {
        return None;
    };
    let repo = repo_path.trim_start_matches('/');
    let repo = repo.strip_suffix(".git").unwrap_or(repo).to_ascii_lowercase();
    // Exactly `owner/repo`, with no empty, `.` or `..` segment that could alias another path.
    let mut parts = repo.split('/');
    let ok = matches!((parts.next(), parts.next(), parts.next()), (Some(o), Some(r), None)
        if [o, r].iter().all(|s| !s.is_empty() && *s != "." && *s != ".."));
    ok.then_some((repo, op))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(fetch: &[&str], push: &[&str]) -> CompiledGitRule {
        CompiledGitRule::new(&GitRule {
            hosts: vec![HostPattern::parse("github.com").unwrap()],
            fetch: fetch.iter().map(|s| (*s).to_owned()).collect(),
            push: push.iter().map(|s| (*s).to_owned()).collect(),
        })
        .unwrap()
    }

    #[test]
    fn smart_http_endpoints_are_recognised() {
        // (case, path, query, repository and operation)
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, Option<(&'a str, GitOp)>);
        let cases: &[Case<'_>] = &[
            (
                "refs for clone",
                "/org/app.git/info/refs",
                Some("service=git-upload-pack"),
                Some(("org/app", GitOp::Fetch)),
            ),
            ("refs for push", "/org/app/info/refs", Some("service=git-receive-pack"), Some(("org/app", GitOp::Push))),
            ("upload pack", "/Org/App.git/git-upload-pack", None, Some(("org/app", GitOp::Fetch))),
            ("receive pack", "/org/app.git/git-receive-pack", None, Some(("org/app", GitOp::Push))),
            ("dumb refs", "/org/app.git/info/refs", None, None),
            ("web page", "/org/app", None, None),
            ("too deep", "/a/b/c/git-receive-pack", None, None),
            ("dot dot", "/org/../git-receive-pack", None, None),
        ];
        for (case, path, query, want) in cases {
            let got = smart_http(path, *query);
            assert_eq!(got.as_ref().map(|(r, o)| (r.as_str(), *o)), *want, "{case}");
        }
    }

    #[test]
    fn fetch_and_push_are_scoped_separately() {
        let r = rule(&["org/*"], &["org/app"]);
        let cases = [
            ("clone in org", "/org/lib.git/git-upload-pack", true),
            ("clone elsewhere", "/attacker/x.git/git-upload-pack", false),
            ("push to app", "/org/app.git/git-receive-pack", true),
            ("push to another org repo", "/org/lib.git/git-receive-pack", false),
            ("push to attacker", "/attacker/exfil.git/git-receive-pack", false),
        ];
        for (case, path, allowed) in cases {
            let v = r.check(path, None);
            assert_eq!(matches!(v, GitVerdict::Allowed { .. }), allowed, "{case}: {v:?}");
        }
        assert_eq!(r.check("/org/app", None), GitVerdict::NotGit);
    }
}
