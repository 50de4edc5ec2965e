//! The `sandgate` binary: parses flags, sets up logging, and runs a subcommand. The logic
//! lives in the library crates; this file only wires them.

#![expect(clippy::print_stdout, reason = "printing results is what a command line does")]

mod cli;
mod disk;
#[cfg(feature = "kubernetes")]
mod kubernetes;
mod limits;
mod reaper;
mod run;
mod sandbox;
mod seccomp;
mod state;
mod webhook;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use sandgate_policy::{CompiledPolicy, Host, Verdict};
use sandgate_proxy::{Limits, ProxyConfig, load_policy};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

use crate::cli::{CaArgs, CaCommand, Cli, Command, LogFormat, PolicyCommand, ProxyArgs, SecretArgs, SecretCommand};

/// Exit status for bad flags (sysexits EX_USAGE).
const EXIT_USAGE: u8 = 64;
/// Exit status for an invalid policy (sysexits EX_DATAERR).
const EXIT_BAD_POLICY: u8 = 65;
/// Exit status when a listener cannot be bound or the proxy cannot start (EX_UNAVAILABLE).
const EXIT_CANNOT_START: u8 = 69;

/// `sandgate webhook`: serves the sidecar injector until stopped.
fn run_webhook(args: cli::WebhookArgs) -> ExitCode {
    let init_image = args.init_image.unwrap_or_else(|| args.image.clone());
    let config = sandgate_sidecar::webhook::InjectConfig {
        proxy_uid: args.proxy_uid,
        policy_configmap: args.policy_configmap,
        ca_configmap: args.ca_configmap,
        vault_secret: args.vault_secret,
        ..sandgate_sidecar::webhook::InjectConfig::new(args.image, init_image)
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandgate webhook: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    let metrics = match webhook::WebhookMetrics::new() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("sandgate webhook: metrics: {e}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    let admin = args.admin;
    let served = rt.block_on(async {
        let admin = async {
            match admin {
                Some(addr) => webhook::serve_admin(addr, metrics.clone()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = webhook::serve(args.listen, args.tls_cert, args.tls_key, config, metrics.clone()) => r,
            r = admin => r,
            _ = wait_for_stop() => Ok(()),
        }
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandgate webhook: {e}");
            ExitCode::from(EXIT_CANNOT_START)
        }
    }
}

/// The first ephemeral port of this network namespace (32768, Linux's default, if unreadable).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// `sandgate init`: installs (or prints) the sidecar's in-pod redirect.
fn init(args: &cli::InitArgs) -> ExitCode {
    use sandgate_sidecar::redirect::{self, Backend, RedirectConfig};
    let config = RedirectConfig {
        proxy_uid: args.proxy_uid,
        transparent_port: args.transparent_port,
        dns_port: args.dns_port,
        inbound_ports: args.inbound_ports.clone(),
        ephemeral_start: ephemeral_start(),
    };
    let mut system = sandgate_sidecar::System;
    let backend = match args.firewall {
        cli::Firewall::Nftables => Backend::Nftables,
        cli::Firewall::IptablesLegacy => Backend::IptablesLegacy,
        cli::Firewall::Auto if args.dry_run => Backend::Nftables,
        cli::Firewall::Auto => redirect::detect(&mut system),
    };
    if args.dry_run {
        match backend {
            Backend::Nftables => print!("{}", config.nft()),
            Backend::IptablesLegacy => print!("{}", config.iptables()),
        }
        return ExitCode::SUCCESS;
    }
    let applied = redirect::apply(&mut system, &config, backend).map_err(|e| e.to_string());
    let verified = applied.and_then(|()| {
        if args.no_verify { Ok(()) } else { redirect::verify(config.transparent_port).map_err(|e| e.to_string()) }
    });
    match verified {
        Ok(()) => {
            tracing::info!(
                ?backend,
                proxy_uid = config.proxy_uid,
                transparent_port = config.transparent_port,
                dns_port = config.dns_port,
                verified = !args.no_verify,
                "redirect installed: outbound TCP and DNS go to the proxy"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate init: {e} (the init container needs NET_ADMIN and NET_RAW)");
            ExitCode::from(EXIT_CANNOT_START)
        }
    }
}

/// Whether the command handles a kubeconfig (sealed secrets in memory).
fn is_kube(command: &Command) -> bool {
    #[cfg(feature = "kubernetes")]
    if matches!(command, Command::Kube(_)) {
        return true;
    }
    let _ = command;
    false
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // `sandgate run` passes the command's stdout through, so its connection log goes to stderr.
    init_logging(cli.log_format, matches!(cli.command, Command::Run(_)));
    // Every command that may open the vault keeps its memory out of core dumps.
    if matches!(cli.command, Command::Proxy(_) | Command::Run(_) | Command::Secret(_) | Command::Ca(_))
        || is_kube(&cli.command)
    {
        for refused in sandgate_vault::protect_process_memory() {
            tracing::warn!("cannot protect process memory ({refused}); a core dump could hold secrets");
        }
    }
    match cli.command {
        Command::Proxy(args) => run_proxy(args),
        Command::Run(args) => match load_policy(args.policy.as_deref()) {
            Ok(policy) => run::run(run::RunSpec {
                policy,
                policy_path: args.policy,
                workspace: args.workspace,
                state_dir: args.state.clone(),
                limits: limits::Limits {
                    cpus: args.cpus,
                    memory: args.memory,
                    pids: args.pids,
                    lifetime: args.lifetime,
                },
                disk: args.disk,
                isolation: args.isolation,
                profile: args.profile.clone(),
                admin: args.admin,
                vault: args.vault.clone(),
                vault_key_file: args.vault_key_file.clone(),
                upstream_ca: args.upstream_ca.clone(),
                command: args.command,
            }),
            Err(e) => {
                eprintln!("sandgate: {e}");
                ExitCode::from(EXIT_BAD_POLICY)
            }
        },
        Command::Policy(PolicyCommand::Check { file }) => match load_policy(Some(&file)) {
            Ok(p) => {
                let profiles: Vec<&str> = p.profile_names().collect();
                println!(
                    "{}: ok ({} profile{}: {})",
                    file.display(),
                    profiles.len(),
                    plural(profiles.len()),
                    profiles.join(", ")
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_BAD_POLICY)
            }
        },
        Command::Policy(PolicyCommand::Explain { file, from, user, destination }) => {
            let path = (file.as_os_str() != "-").then_some(file.as_path());
            match load_policy(path) {
                Ok(p) => explain(&p, from, user.as_deref(), &destination),
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(EXIT_BAD_POLICY)
                }
            }
        }
        Command::Secret(args) => secret(args),
        Command::Init(args) => init(&args),
        Command::Webhook(args) => run_webhook(*args),
        #[cfg(feature = "kubernetes")]
        Command::Kube(args) => kubernetes::main(*args),
        #[cfg(not(feature = "kubernetes"))]
        Command::Kube { .. } => {
            eprintln!(
                "sandgate: this build has no Kubernetes support; build it with \
                 `cargo build --release --features sandgate-control/kubernetes` (the images in deploy/ have it)"
            );
            ExitCode::from(EXIT_USAGE)
        }
        Command::Sandbox(args) => match state::State::open(&args.state) {
            Ok(s) => match args.command {
                cli::SandboxCommand::Ls => sandbox::ls(&s),
                cli::SandboxCommand::Create { run_args } => sandbox::create(&s, &args.state, &run_args),
                cli::SandboxCommand::Exec { id, command } => sandbox::exec(&s, &id, &command),
                cli::SandboxCommand::Pause { id } => sandbox::pause(&s, &id, true),
                cli::SandboxCommand::Resume { id } => sandbox::pause(&s, &id, false),
                cli::SandboxCommand::Rm { id } => sandbox::rm(&s, &args.state, &id),
            },
            Err(e) => {
                eprintln!("sandgate sandbox: {e}");
                ExitCode::from(EXIT_VAULT)
            }
        },
        Command::Reap(args) => match state::State::open(&args.state) {
            Ok(s) => {
                for line in reaper::reap(&s, &args.state) {
                    println!("removed {line}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sandgate reap: {e}");
                ExitCode::from(EXIT_VAULT)
            }
        },
        Command::Ca(args) => ca(args),
        Command::Policy(PolicyCommand::Default) => {
            print!("{}", sandgate_policy::DEFAULT_POLICY_YAML);
            ExitCode::SUCCESS
        }
    }
}

/// Exit status for a vault that cannot be opened or a secret that cannot be read.
const EXIT_VAULT: u8 = 74;

fn secret(args: SecretArgs) -> ExitCode {
    use sandgate_vault::Secret;
    use std::io::Read;
    let create = matches!(args.command, SecretCommand::Set { .. });
    let mut vault = match open_vault(&args.vault.vault, &args.vault.key_file, create) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EXIT_VAULT);
        }
    };
    let result = match args.command {
        SecretCommand::Set { name } => {
            let mut value = Vec::new();
            if let Err(e) = std::io::stdin().read_to_end(&mut value) {
                eprintln!("sandgate: cannot read the value from standard input: {e}");
                return ExitCode::from(EXIT_VAULT);
            }
            if value.last() == Some(&b'\n') {
                value.pop();
                if value.last() == Some(&b'\r') {
                    value.pop();
                }
            }
            let value = Secret::new(value);
            if value.expose().is_empty() {
                eprintln!(
                    "sandgate: the value is empty; pipe it in, e.g. `printf %s \"$TOKEN\" | sandgate secret set {name}`"
                );
                return ExitCode::from(EXIT_USAGE);
            }
            vault.set(&name, &value).map(|()| eprintln!("sandgate: sealed `{name}` in {}", args.vault.vault.display()))
        }
        SecretCommand::List => {
            for name in vault.names() {
                println!("{name}");
            }
            Ok(())
        }
        SecretCommand::Rm { name } => match vault.remove(&name) {
            Ok(true) => {
                eprintln!("sandgate: removed `{name}`");
                Ok(())
            }
            Ok(false) => Err(sandgate_vault::VaultError::NotFound { name }),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandgate: {e}");
            ExitCode::from(EXIT_VAULT)
        }
    }
}

pub(crate) fn open_vault(
    vault: &std::path::Path,
    key_file: &std::path::Path,
    create_key: bool,
) -> Result<sandgate_vault::Vault, sandgate_vault::VaultError> {
    let env_key = std::env::var(sandgate_vault::KEY_ENV).ok();
    sandgate_vault::VaultKey::load(key_file, env_key.as_deref(), create_key)
        .and_then(|k| sandgate_vault::Vault::open(vault, k))
}

fn ca(args: CaArgs) -> ExitCode {
    use sandgate_proxy::intercept::CertAuthority;
    let create = matches!(args.command, CaCommand::Init { .. });
    let mut vault = match open_vault(&args.vault.vault, &args.vault.key_file, create) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EXIT_VAULT);
        }
    };
    let pem = match args.command {
        CaCommand::Init { force } => CertAuthority::init(&mut vault, force),
        CaCommand::Cert => CertAuthority::load(&vault).map(|ca| ca.cert_pem().to_owned()),
    };
    match pem {
        Ok(pem) => {
            print!("{pem}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandgate: {e}");
            ExitCode::from(EXIT_VAULT)
        }
    }
}

/// The interceptor (Sandgate's CA and the credentials) when the policy needs one or a vault is
/// given; an error (exit status, message) before anything listens otherwise.
pub(crate) fn build_interceptor(
    policy: &CompiledPolicy,
    vault: Option<&std::path::Path>,
    key_file: &std::path::Path,
    upstream_ca: &[std::path::PathBuf],
    metrics: &sandgate_proxy::ProxyMetrics,
) -> Result<Option<std::sync::Arc<sandgate_proxy::Interceptor>>, (u8, String)> {
    let Some(vault_path) = vault else {
        if policy.needs_interception() {
            return Err((
                EXIT_BAD_POLICY,
                "the policy has credential or git rules, so the proxy needs its CA and secrets: pass --vault FILE (see `sandgate ca init` and `sandgate secret set`)".into(),
            ));
        }
        return Ok(None);
    };
    open_vault(vault_path, key_file, false)
        .map_err(|e| e.to_string())
        .and_then(|v| sandgate_proxy::Interceptor::new(v, policy, upstream_ca, metrics).map_err(|e| e.to_string()))
        .map(Some)
        .map_err(|e| (EXIT_VAULT, e))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Diagnostics go to stderr (text or JSON); the connection log (`sandgate::conn`) goes to
/// stdout as JSON lines, one per connection, whatever the diagnostic format.
fn init_logging(format: LogFormat, conn_to_stderr: bool) {
    let filter = EnvFilter::try_from_env("SANDGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let not_conn = filter::filter_fn(|m| m.target() != sandgate_proxy::log::TARGET);
    let diag = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .with_filter(not_conn)
            .boxed(),
        LogFormat::Json => {
            tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).with_filter(not_conn).boxed()
        }
    };
    let conn = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_writer(move || -> Box<dyn std::io::Write> {
            if conn_to_stderr { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) }
        })
        .with_filter(filter::Targets::new().with_target(sandgate_proxy::log::TARGET, tracing::Level::INFO));
    tracing_subscriber::registry().with(filter).with(diag).with(conn).init();
}

fn run_proxy(args: Box<ProxyArgs>) -> ExitCode {
    // The policy is checked before anything binds, so a bad file never half-starts a proxy.
    let policy = match load_policy(args.policy.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EXIT_BAD_POLICY);
        }
    };
    let metrics = match sandgate_proxy::ProxyMetrics::new() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("sandgate: metrics: {e}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    let interceptor =
        match build_interceptor(&policy, args.vault.as_deref(), &args.vault_key_file, &args.upstream_ca, &metrics) {
            Ok(i) => i,
            Err((code, e)) => {
                eprintln!("sandgate: {e}");
                return ExitCode::from(code);
            }
        };
    #[cfg(feature = "kubernetes")]
    let agent = match &args.node_agent {
        Some(_) if !args.sni_relay.is_empty() || args.dns.is_some() => {
            eprintln!(
                "sandgate: --node-agent serves the explicit listener only (sandboxes present a token); drop --sni-relay and --dns"
            );
            return ExitCode::from(EXIT_USAGE);
        }
        Some(node) => Some((
            node.clone(),
            args.kubeconfig.clone(),
            std::sync::Arc::new(sandgate_proxy::identity::Identities::new()),
        )),
        None => None,
    };
    #[cfg(feature = "kubernetes")]
    let (identities, no_transparent) = (agent.as_ref().map(|a| a.2.clone()), args.no_transparent || agent.is_some());
    #[cfg(not(feature = "kubernetes"))]
    if args.node_agent.is_some() || args.kubeconfig.is_some() {
        eprintln!("sandgate: --node-agent needs a build with the `kubernetes` feature (the images in deploy/ have it)");
        return ExitCode::from(EXIT_USAGE);
    }
    #[cfg(not(feature = "kubernetes"))]
    let (identities, no_transparent) = (None, args.no_transparent);
    let config = ProxyConfig {
        interceptor,
        metrics: Some(metrics),
        sandbox: None,
        profile: None,
        identities,
        explicit: Some(args.listen),
        transparent: (!no_transparent).then_some(args.transparent),
        sni_relays: args.sni_relay,
        admin: (!args.no_admin).then_some(args.admin),
        dns: args.dns,
        dns_servers: args.dns_server,
        policy_path: args.policy,
        policy_poll: args.policy_poll,
        workers: args.workers.unwrap_or_else(sandgate_proxy::default_workers),
        limits: Limits {
            max_header_bytes: args.max_header_bytes,
            header_timeout: args.header_timeout,
            max_hello_bytes: args.max_hello_bytes,
            hello_timeout: args.hello_timeout,
            first_byte_timeout: args.first_byte_timeout,
            connect_timeout: args.connect_timeout,
            idle_timeout: args.idle_timeout,
            max_connections: args.max_connections,
            max_connections_per_client: args.max_connections_per_client,
            drain_timeout: args.drain_timeout,
        },
    };
    // This runtime only runs signals, the admin listener and the policy watcher; connections
    // are served by the proxy's own worker threads.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandgate: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    #[cfg(feature = "kubernetes")]
    if let Some((node, kubeconfig, ids)) = agent {
        return runtime.block_on(async move {
            let client = match kubernetes::agent::client(kubeconfig.as_deref()).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("sandgate: node agent: {e}");
                    return ExitCode::from(EXIT_CANNOT_START);
                }
            };
            tracing::info!(%node, "node agent: serving Sandgate's sandbox pods on this node");
            let watcher = tokio::spawn(kubernetes::agent::watch(client, node, ids));
            let code = serve(config, policy).await;
            watcher.abort();
            code
        });
    }
    runtime.block_on(serve(config, policy))
}

async fn serve(config: ProxyConfig, policy: CompiledPolicy) -> ExitCode {
    let origin = policy.origin().to_owned();
    let running = match sandgate_proxy::start(config, policy).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandgate: {e}");
            return ExitCode::from(EXIT_CANNOT_START);
        }
    };
    tracing::info!(policy = %origin, "sandgate proxy started");
    let listeners = [
        ("explicit", running.explicit),
        ("transparent", running.transparent),
        ("admin", running.admin),
        ("dns", running.dns),
    ];
    for (what, addr) in listeners {
        if let Some(addr) = addr {
            tracing::info!(target: "sandgate::listen", listener = what, %addr, "listening");
        }
    }
    for addr in &running.sni_relays {
        tracing::info!(target: "sandgate::listen", listener = "sni", %addr, "listening");
    }
    let signal = wait_for_stop().await;
    tracing::info!("{signal}: draining live connections");
    let left = running.drain().await;
    if left > 0 {
        tracing::warn!(open = left, "drain timeout: closing remaining connections");
    } else {
        tracing::info!("drained; exiting");
    }
    let _ = std::io::stdout().flush();
    ExitCode::SUCCESS
}

async fn wait_for_stop() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

fn explain(policy: &CompiledPolicy, from: std::net::IpAddr, user: Option<&str>, destination: &str) -> ExitCode {
    let Some((host, port)) = split_host_port(destination) else {
        eprintln!("sandgate: `{destination}`: write HOST:PORT, e.g. github.com:443 or [2001:db8::1]:443");
        return ExitCode::from(EXIT_USAGE);
    };
    let host = match Host::parse(host) {
        Ok(h) => h,
        Err(_) => {
            eprintln!("sandgate: `{host}` is not a host name or IP address");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let profile = policy.select_profile(from, user);
    let mut d = policy.decide(profile, &host, port);
    let mut note = String::new();
    if let Host::Name(name) = &host
        && let Some(addrs) = policy.static_addrs(name)
    {
        match policy.vet(&d, addrs, port) {
            Ok(permit) => {
                note = format!("would dial {} (from resolve:)", permit.upstream());
                d = *permit.decision();
            }
            Err(denial) => d = denial,
        }
    } else if matches!(host, Host::Name(_)) && d.verdict.proceeds() {
        note = "the name is resolved at connection time; the addresses are vetted then".to_owned();
    }
    println!("destination: {host}:{port}");
    println!("profile:     {} ({})", policy.profile_name(d.profile), d.mode.as_str());
    println!("verdict:     {}", d.verdict.as_str());
    println!("reason:      {} ({})", d.reason.as_str(), d.reason.describe());
    println!("rule:        {}", d.rule.map_or("-", |r| policy.rule_name(r)));
    if !note.is_empty() {
        println!("note:        {note}");
    }
    if d.verdict == Verdict::Deny { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    if host.contains(':') && !host.starts_with('[') {
        return None;
    }
    Some((host, port.parse().ok()?))
}
