//! `sandgate kube ...`: sandboxes on a user's Kubernetes cluster. The kubeconfig is sealed in
//! the vault (`kube connect` saves it only once "Test connection" passes); every other command
//! opens it in memory. The cluster is the record: labels and annotations on the objects say
//! which sandbox they belong to and when it expires, so no local state can drift from it.

pub(crate) mod agent;
pub(crate) mod manifests;
pub(crate) mod provider;

use std::process::ExitCode;

use crate::cli::{KubeArgs, KubeCommand};
use provider::{KubeError, Provider};

/// Exit status when the cluster refused or a check failed.
const EXIT_KUBE: u8 = 1;

/// Runs one `sandgate kube` command.
pub(crate) fn main(args: KubeArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate kube: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_KUBE);
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sandgate kube: {e}");
            ExitCode::from(EXIT_KUBE)
        }
    }
}

async fn run(args: KubeArgs) -> Result<ExitCode, String> {
    let connect = matches!(args.command, KubeCommand::Connect { .. });
    // In a cluster (the reaper's CronJob) the pod's own service account is the credential.
    let (client, stored) = if args.in_cluster {
        if connect {
            return Err("--in-cluster uses the pod's service account: there is no kubeconfig to connect".into());
        }
        (agent::client(None).await?, None)
    } else if let KubeCommand::Connect { kubeconfig, .. } = &args.command {
        // The file is read and checked before the vault (and its key) is touched.
        let text =
            std::fs::read_to_string(kubeconfig).map_err(|e| format!("cannot read {}: {e}", kubeconfig.display()))?;
        let client = provider::client(&text, args.allow_exec).await.map_err(|e| e.to_string())?;
        let vault = crate::open_vault(&args.vault.vault, &args.vault.key_file, true).map_err(|e| e.to_string())?;
        (client, Some((vault, text)))
    } else {
        let vault = crate::open_vault(&args.vault.vault, &args.vault.key_file, false).map_err(|e| e.to_string())?;
        let sealed = vault
            .get(&args.kubeconfig_secret)
            .map_err(|e| format!("{e} (store a kubeconfig first: `sandgate kube connect --kubeconfig FILE`)"))?;
        let kubeconfig =
            String::from_utf8(sealed.expose().clone()).map_err(|_| "the sealed kubeconfig is not UTF-8".to_owned())?;
        let client = provider::client(&kubeconfig, args.allow_exec).await.map_err(|e| e.to_string())?;
        (client, Some((vault, kubeconfig)))
    };
    let target = manifests::Target {
        namespace: args.namespace.clone(),
        runtime_class: (args.runtime_class != "none").then(|| args.runtime_class.clone()),
        storage_class: args.storage_class.clone(),
        image: args.image.clone(),
        proxy: args.proxy.clone().unwrap_or_default(),
        proxy_namespace: args.proxy_namespace.clone(),
        proxy_app: args.proxy_app.clone(),
        ca_configmap: args.ca_configmap.clone(),
    };
    let needs_proxy = matches!(
        args.command,
        KubeCommand::Create { .. } | KubeCommand::Resume { .. } | KubeCommand::Test { deep: true, .. }
    );
    if needs_proxy && args.proxy.is_none() {
        return Err("--proxy HOST:PORT is required: where sandboxes reach Sandgate (the node agent's Service)".into());
    }
    let p = Provider::new(client, target);
    let now = crate::state::now();
    let done = |r: Result<(), KubeError>, what: String| match r {
        Ok(()) => {
            eprintln!("sandgate kube: {what}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e.to_string()),
    };
    match args.command {
        KubeCommand::Connect { force, .. } => {
            let Some((mut vault, kubeconfig)) = stored else { return Err("no kubeconfig to connect".into()) };
            let ok = report(&p.test_connection().await);
            if !ok && !force {
                return Err("not saved: fix the failures above (or pass --force)".into());
            }
            let secret = sandgate_vault::Secret::new(kubeconfig.into_bytes());
            vault.set(&args.kubeconfig_secret, &secret).map_err(|e| e.to_string())?;
            eprintln!("sandgate kube: kubeconfig sealed in the vault as `{}`", args.kubeconfig_secret);
            Ok(ExitCode::SUCCESS)
        }
        KubeCommand::Test { deep, probe_image } => {
            let mut checks = p.test_connection().await;
            if deep {
                let sbx = new_sandbox("default".into(), now, 120, (0.1, 64, 64))?;
                checks.push(p.deep_check(&sbx, &probe_image).await);
            }
            Ok(if report(&checks) { ExitCode::SUCCESS } else { ExitCode::from(EXIT_KUBE) })
        }
        KubeCommand::Create { cpus, memory, disk, lifetime, profile } => {
            let lifetime_s = i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX);
            let sbx = new_sandbox(profile, now, lifetime_s, (cpus, memory >> 20, disk >> 20))?;
            p.create(&sbx, lifetime).await.map_err(|e| e.to_string())?;
            println!("{}", sbx.id);
            Ok(ExitCode::SUCCESS)
        }
        KubeCommand::Pause { id } => done(p.pause(&id).await, format!("{id} paused (pod deleted, workspace kept)")),
        KubeCommand::Resume { id } => done(p.resume(&id, &random_token()?, now).await, format!("{id} resumed")),
        KubeCommand::Rm { id } => done(p.destroy(&id).await, format!("{id} removed")),
        KubeCommand::Ls => {
            let rows = p.list().await.map_err(|e| e.to_string())?;
            println!("{:<8} {:<10} EXPIRES AT", "ID", "STATE");
            for r in rows {
                println!("{:<8} {:<10} {}", r.id, r.state, r.expires_at);
            }
            Ok(ExitCode::SUCCESS)
        }
        KubeCommand::Reap => {
            for line in p.reap(now).await.map_err(|e| e.to_string())? {
                println!("removed {line}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Prints the checks; `true` when all passed.
fn report(checks: &[provider::Check]) -> bool {
    for c in checks {
        if c.ok {
            println!("ok    {}", c.what);
        } else {
            println!("FAIL  {}: {}", c.what, c.why);
        }
    }
    checks.iter().all(|c| c.ok)
}

/// A new sandbox (fresh id and token) living `lifetime_s` seconds from `now`, with
/// `(cpus, memory MiB, disk MiB)`.
fn new_sandbox(
    profile: String,
    now: i64,
    lifetime_s: i64,
    limits: (f64, u64, u64),
) -> Result<manifests::Sandbox, String> {
    Ok(manifests::Sandbox {
        id: crate::run::random_id()?,
        token: random_token()?,
        profile,
        created_at: provider::format_time(now),
        expires_at: provider::format_time(now.saturating_add(lifetime_s)),
        cpus: limits.0,
        memory_mib: limits.1,
        disk_mib: limits.2,
    })
}

/// A per-sandbox proxy token: 128 random bits, hex.
fn random_token() -> Result<String, String> {
    let mut raw = [0u8; 16];
    rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| format!("random token: {e}"))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}
