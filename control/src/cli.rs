//! The `sandgate` command line: every flag with its environment variable and what it is for.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Sandgate: the egress proxy and credential broker in front of AI coding-agent sandboxes.
///
/// Sandboxes reach only the hosts a policy allows; every decision is logged (one JSON line per
/// connection on stdout) and counted (Prometheus on the admin listener).
#[derive(Debug, Parser)]
#[command(name = "sandgate", version, propagate_version = true, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Diagnostic log format on stderr (the connection log on stdout is always JSON).
    #[arg(long, global = true, value_enum, default_value = "text", env = "SANDGATE_LOG_FORMAT")]
    pub(crate) log_format: LogFormat,
}

/// Diagnostic log formats.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command in a sandbox that can reach only what the policy allows.
    ///
    /// Makes a network namespace attached to this host by a veth, runs the proxy on the gateway
    /// side with rules that send all the sandbox's TCP and DNS to it and drop everything else,
    /// and runs CMD under bubblewrap (host filesystem read-only, private /tmp, writable
    /// /workspace, all capabilities dropped). Stdio is passed through; the exit status is CMD's.
    /// Needs root, iproute2, nftables and bubblewrap.
    Run(RunArgs),
    /// List, pause, resume or remove local sandboxes.
    Sandbox(SandboxArgs),
    /// Remove sandboxes past their lifetime and everything orphaned by a crashed owner.
    ///
    /// `sandgate run` does this at every start; run it from a timer to do it periodically.
    Reap(ReapArgs),
    /// Run the egress proxy.
    ///
    /// Without --policy it enforces the embedded default: github.com, gitlab.com,
    /// bitbucket.org, registry.npmjs.org and pypi.org on ports 443 and 80. Every listener
    /// defaults to loopback. SIGHUP (or a change to the policy file) reloads the policy;
    /// SIGTERM drains live connections and exits.
    Proxy(Box<ProxyArgs>),
    /// Check, explain or print policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Install the in-pod redirect of a Kubernetes sidecar (the init container's job).
    ///
    /// In the pod's network namespace: all outbound TCP to the sidecar's transparent port, DNS
    /// to its DNS port, the proxy's UID exempt, every other outbound packet dropped, and nothing
    /// new inbound except the admin port (probes). Idempotent: a second run changes nothing.
    /// nftables where the kernel has it (runc, Kata), else iptables-legacy (gVisor). Needs
    /// NET_ADMIN and NET_RAW.
    Init(InitArgs),
    /// Serve the sidecar injector: a mutating admission webhook (AdmissionReview v1, HTTPS).
    ///
    /// POST /inject/namespace for pods of namespaces labelled `sandgate.dev/inject=enabled`,
    /// POST /inject/pod for pods that opt in by label or annotation. Injects `sandgate init` and
    /// the proxy as a native sidecar; refuses pods that could bypass it (privileged, NET_ADMIN,
    /// NET_RAW, SETUID, SETGID, host network, the proxy's UID), saying why. The certificate is
    /// re-read when its files change (cert-manager renewals).
    Webhook(Box<WebhookArgs>),
    /// Sandboxes on a Kubernetes cluster: connect, test, create, ls, pause, resume, rm, reap.
    ///
    /// Each sandbox is a pod (gVisor runtime class by default, no service-account token, all
    /// capabilities dropped, RuntimeDefault seccomp, limits, a deadline at its expiry) whose
    /// NetworkPolicy allows egress only to the Sandgate proxy and no ingress, using the proxy
    /// with a per-sandbox token. A ConfigMap anchor owns the pod, the policy and the workspace
    /// claim. The kubeconfig is sealed in the vault by `kube connect`.
    #[cfg(feature = "kubernetes")]
    Kube(Box<KubeArgs>),
    /// Sandboxes on a Kubernetes cluster (not in this build: it lacks the `kubernetes` feature).
    #[cfg(not(feature = "kubernetes"))]
    #[command(disable_help_flag = true)]
    Kube {
        /// Ignored.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Create or print Sandgate's certificate authority (for intercepted hosts).
    ///
    /// `ca init` makes an ECDSA P-256 CA and seals its key in the vault; `ca cert` prints the
    /// certificate that sandboxes must trust (SSL_CERT_FILE, GIT_SSL_CAINFO, ...).
    Ca(CaArgs),
    /// Store, list and remove secrets (git tokens, provider keys) sealed in the vault.
    ///
    /// Values are sealed with AES-256-GCM under the vault key: a key file created with mode
    /// 0600 on first use, or SANDGATE_VAULT_KEY (32 bytes, base64). Values are read from
    /// standard input, never from the command line, and are never printed.
    Secret(SecretArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CaArgs {
    #[command(flatten)]
    pub(crate) vault: VaultArgs,
    #[command(subcommand)]
    pub(crate) command: CaCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CaCommand {
    /// Create the CA (refuses to replace one without --force) and print its certificate.
    Init {
        /// Replace an existing CA (every sandbox must then trust the new one).
        #[arg(long)]
        force: bool,
    },
    /// Print the CA certificate (PEM).
    Cert,
}

/// Where the vault and its key are.
#[derive(Debug, Clone, Args)]
pub(crate) struct VaultArgs {
    /// The vault file.
    #[arg(long, value_name = "FILE", default_value = "sandgate-vault.json", env = "SANDGATE_VAULT", global = true)]
    pub(crate) vault: PathBuf,
    /// The vault key file (created 0600 on first `set`); ignored when SANDGATE_VAULT_KEY is set.
    #[arg(
        long = "key-file",
        value_name = "FILE",
        default_value = "sandgate-vault.key",
        env = "SANDGATE_VAULT_KEY_FILE",
        global = true
    )]
    pub(crate) key_file: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct SecretArgs {
    #[command(flatten)]
    pub(crate) vault: VaultArgs,
    #[command(subcommand)]
    pub(crate) command: SecretCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SecretCommand {
    /// Seal the value read from standard input as NAME (one trailing newline is dropped).
    Set {
        /// The secret's name: 1 to 64 letters, digits, `-`, `_` or `.`.
        name: String,
    },
    /// List the secrets' names (never their values).
    #[command(alias = "ls")]
    List,
    /// Remove the secret NAME.
    #[command(alias = "remove")]
    Rm {
        /// The secret's name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct SandboxArgs {
    /// The state directory (SQLite database).
    #[arg(long, value_name = "DIR", default_value_os_t = crate::state::default_dir(), env = "SANDGATE_STATE", global = true)]
    pub(crate) state: PathBuf,
    #[command(subcommand)]
    pub(crate) command: SandboxCommand,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SandboxCommand {
    /// Create a long-lived sandbox (a detached `sandgate run` whose command idles) and print
    /// its id; `exec` runs commands in it. Takes `sandgate run`'s options, e.g.
    /// `sandgate sandbox create -- --memory 1G --workspace ./ws`.
    Create {
        /// Options for `sandgate run` (policy, limits, workspace, vault).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "RUN OPTIONS")]
        run_args: Vec<String>,
    },
    /// Run a command inside a running sandbox (stdio passed through; its exit status).
    Exec {
        /// The sandbox's id.
        id: String,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// List sandboxes: id, state, how it ended, age, time left, workspace.
    #[command(alias = "list")]
    Ls,
    /// Freeze a running sandbox (cgroup freezer); processes and workspace are kept.
    Pause {
        /// The sandbox's id.
        id: String,
    },
    /// Thaw a paused sandbox.
    Resume {
        /// The sandbox's id.
        id: String,
    },
    /// Stop a sandbox and remove what was made for it (its workspace is kept).
    Rm {
        /// The sandbox's id.
        id: String,
    },
}

#[cfg(feature = "kubernetes")]
#[derive(Debug, Args)]
pub(crate) struct KubeArgs {
    #[command(flatten)]
    pub(crate) vault: VaultArgs,
    /// The vault secret holding the kubeconfig.
    #[arg(long, value_name = "NAME", default_value = "kubeconfig", env = "SANDGATE_KUBECONFIG_SECRET", global = true)]
    pub(crate) kubeconfig_secret: String,
    /// Accept a kubeconfig whose credentials come from running a program (`exec`, auth
    /// providers): that program then runs on this host.
    #[arg(long, global = true)]
    pub(crate) allow_exec: bool,
    /// Use the pod's own service account instead of the sealed kubeconfig (the reaper's
    /// CronJob in deploy/kubernetes/provider runs `sandgate kube --in-cluster reap`).
    #[arg(long, global = true)]
    pub(crate) in_cluster: bool,
    /// The namespace sandboxes live in (set up by deploy/kubernetes/provider).
    #[arg(
        long,
        value_name = "NS",
        default_value = "sandgate-sandboxes",
        env = "SANDGATE_K8S_NAMESPACE",
        global = true
    )]
    pub(crate) namespace: String,
    /// The runtime class of sandbox pods: `gvisor`, `kata`, ... or `none` for the default.
    #[arg(long, value_name = "NAME", default_value = "gvisor", env = "SANDGATE_K8S_RUNTIME_CLASS", global = true)]
    pub(crate) runtime_class: String,
    /// A storage class for the workspace claim (the workspace then survives pause); without
    /// it the workspace is an emptyDir and pausing loses it.
    #[arg(long, value_name = "NAME", env = "SANDGATE_K8S_STORAGE_CLASS", global = true)]
    pub(crate) storage_class: Option<String>,
    /// The sandbox image.
    #[arg(
        long,
        value_name = "IMAGE",
        default_value = "debian:bookworm-slim",
        env = "SANDGATE_K8S_IMAGE",
        global = true
    )]
    pub(crate) image: String,
    /// Where sandboxes reach the proxy, `HOST:PORT` (the node agent Service's ClusterIP).
    #[arg(long, value_name = "HOST:PORT", env = "SANDGATE_K8S_PROXY", global = true)]
    pub(crate) proxy: Option<String>,
    /// The proxy pods' namespace (the NetworkPolicy allows egress only to them).
    #[arg(
        long,
        value_name = "NS",
        default_value = "sandgate-system",
        env = "SANDGATE_K8S_PROXY_NAMESPACE",
        global = true
    )]
    pub(crate) proxy_namespace: String,
    /// The proxy pods' `app.kubernetes.io/name` label.
    #[arg(long, value_name = "NAME", default_value = "sandgate-agent", env = "SANDGATE_K8S_PROXY_APP", global = true)]
    pub(crate) proxy_app: String,
    /// The ConfigMap in the sandbox namespace with Sandgate's CA (`ca.crt`).
    #[arg(long, value_name = "NAME", default_value = "sandgate-ca", env = "SANDGATE_K8S_CA_CONFIGMAP", global = true)]
    pub(crate) ca_configmap: String,
    #[command(subcommand)]
    pub(crate) command: KubeCommand,
}

#[cfg(feature = "kubernetes")]
#[derive(Debug, Subcommand)]
pub(crate) enum KubeCommand {
    /// Test a kubeconfig and, when every check passes, seal it in the vault.
    Connect {
        /// The kubeconfig file (prefer a ServiceAccount token bound to the namespace).
        #[arg(long, value_name = "FILE")]
        kubeconfig: PathBuf,
        /// Save it even when checks fail.
        #[arg(long)]
        force: bool,
    },
    /// Check the stored connection: API version, namespace, each permission the provider
    /// needs, the runtime class and the storage class; every failure by name (exit 1).
    Test {
        /// Also run a probe sandbox (needs --proxy): it must fail to reach an outside address
        /// directly and reach the proxy; the only way to find a CNI that ignores NetworkPolicy.
        #[arg(long)]
        deep: bool,
        /// The probe's image (it needs `sh` and `curl`).
        #[arg(long, value_name = "IMAGE", default_value = "curlimages/curl:8.11.1")]
        probe_image: String,
    },
    /// Create a sandbox and print its id.
    Create {
        /// CPUs (requests = limits).
        #[arg(long, value_name = "N", default_value_t = crate::limits::DEFAULT_CPUS)]
        cpus: f64,
        /// Memory (requests = limits), e.g. 2048M.
        #[arg(long, value_name = "SIZE", default_value = "2048M", value_parser = crate::limits::parse_size)]
        memory: u64,
        /// Workspace size: the claim's size, or the ephemeral-storage limit without one.
        #[arg(long, value_name = "SIZE", default_value = "10240M", value_parser = crate::limits::parse_size)]
        disk: u64,
        /// Lifetime, at most 6h (the pod's activeDeadlineSeconds; the reaper removes the rest).
        #[arg(long, value_name = "DURATION", default_value = "6h", value_parser = parse_lifetime)]
        lifetime: Duration,
        /// The policy profile the proxy gives this sandbox.
        #[arg(long, value_name = "NAME", default_value = "default")]
        profile: String,
    },
    /// List sandboxes in the namespace.
    #[command(alias = "list")]
    Ls,
    /// Delete a sandbox's pod and keep its workspace claim.
    Pause {
        /// The sandbox's id.
        id: String,
    },
    /// Recreate a paused sandbox's pod on its claim, with the lifetime that remains.
    Resume {
        /// The sandbox's id.
        id: String,
    },
    /// Delete a sandbox and everything it owns.
    #[command(alias = "remove")]
    Rm {
        /// The sandbox's id.
        id: String,
    },
    /// Delete expired sandboxes (paused ones too) and orphaned pods, claims and policies.
    Reap,
}

#[derive(Debug, Args)]
pub(crate) struct WebhookArgs {
    /// HTTPS listener for the API server.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443", env = "SANDGATE_WEBHOOK_LISTEN")]
    pub(crate) listen: SocketAddr,
    /// Plain-HTTP admin listener: `/metrics` (reviews by verdict) and `/healthz`; none unless
    /// given.
    #[arg(long, value_name = "ADDR", env = "SANDGATE_WEBHOOK_ADMIN")]
    pub(crate) admin: Option<SocketAddr>,
    /// The serving certificate (PEM, chain first); cert-manager's `tls.crt`.
    #[arg(long, value_name = "FILE", default_value = "/etc/sandgate/webhook/tls.crt", env = "SANDGATE_WEBHOOK_CERT")]
    pub(crate) tls_cert: PathBuf,
    /// The serving key (PEM); cert-manager's `tls.key`.
    #[arg(long, value_name = "FILE", default_value = "/etc/sandgate/webhook/tls.key", env = "SANDGATE_WEBHOOK_KEY")]
    pub(crate) tls_key: PathBuf,
    /// The Sandgate image injected as the proxy sidecar.
    #[arg(long, value_name = "IMAGE", env = "SANDGATE_IMAGE")]
    pub(crate) image: String,
    /// The image injected as the init container (`sandgate init` needs nft and
    /// iptables-legacy, which the distroless proxy image lacks); default: --image.
    #[arg(long, value_name = "IMAGE", env = "SANDGATE_INIT_IMAGE")]
    pub(crate) init_image: Option<String>,
    /// The UID the injected proxy runs as (app containers may not use it).
    #[arg(long, value_name = "UID", default_value_t = sandgate_sidecar::redirect::DEFAULT_PROXY_UID, env = "SANDGATE_PROXY_UID")]
    pub(crate) proxy_uid: u32,
    /// The ConfigMap (in the pod's namespace) with the policy under `policy.yaml`.
    #[arg(long, value_name = "NAME", default_value = "sandgate-policy", env = "SANDGATE_POLICY_CONFIGMAP")]
    pub(crate) policy_configmap: String,
    /// The ConfigMap (in the pod's namespace) with Sandgate's CA certificate under `ca.crt`.
    #[arg(long, value_name = "NAME", default_value = "sandgate-ca", env = "SANDGATE_CA_CONFIGMAP")]
    pub(crate) ca_configmap: String,
    /// The Secret with `vault.json` and `vault.key`, mounted into the proxy only (for
    /// credential injection); none unless given.
    #[arg(long, value_name = "NAME", env = "SANDGATE_VAULT_SECRET")]
    pub(crate) vault_secret: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// The UID the sidecar proxy runs as; its connections are not redirected. The webhook
    /// refuses app containers that run as this UID.
    #[arg(long, value_name = "UID", default_value_t = sandgate_sidecar::redirect::DEFAULT_PROXY_UID, env = "SANDGATE_PROXY_UID")]
    pub(crate) proxy_uid: u32,
    /// The sidecar's transparent listener port (on loopback).
    #[arg(long, value_name = "PORT", default_value_t = sandgate_sidecar::redirect::DEFAULT_TRANSPARENT_PORT, env = "SANDGATE_TRANSPARENT_PORT")]
    pub(crate) transparent_port: u16,
    /// The sidecar's DNS port (on loopback).
    #[arg(long, value_name = "PORT", default_value_t = sandgate_sidecar::redirect::DEFAULT_DNS_PORT, env = "SANDGATE_DNS_PORT")]
    pub(crate) dns_port: u16,
    /// Inbound TCP ports left open (the sidecar's admin port, for the kubelet's probes).
    #[arg(long, value_name = "PORT", default_value = "4752", value_delimiter = ',', env = "SANDGATE_INBOUND_PORTS")]
    pub(crate) inbound_ports: Vec<u16>,
    /// The packet filter: `auto` uses nftables when it works, else iptables-legacy.
    #[arg(long, value_enum, default_value = "auto", env = "SANDGATE_FIREWALL")]
    pub(crate) firewall: Firewall,
    /// Print the rules instead of installing them.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Do not prove the redirect after installing it. By default a connection to an address
    /// that exists nowhere must arrive on the transparent port, or `init` fails (and with it
    /// the pod, before any app container starts).
    #[arg(long)]
    pub(crate) no_verify: bool,
}

/// Packet filters `sandgate init` can program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Firewall {
    /// nftables if `nft list tables` works, else iptables-legacy.
    Auto,
    /// nftables (runc, Kata).
    Nftables,
    /// iptables-legacy (gVisor; no comment or conntrack matches).
    IptablesLegacy,
}

#[derive(Debug, Args)]
pub(crate) struct ReapArgs {
    /// The state directory (SQLite database).
    #[arg(long, value_name = "DIR", default_value_os_t = crate::state::default_dir(), env = "SANDGATE_STATE")]
    pub(crate) state: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The state directory (SQLite database of sandboxes).
    #[arg(long, value_name = "DIR", default_value_os_t = crate::state::default_dir(), env = "SANDGATE_STATE")]
    pub(crate) state: PathBuf,
    /// Policy file; without it, the embedded default allowlist.
    #[arg(long, value_name = "FILE", env = "SANDGATE_POLICY")]
    pub(crate) policy: Option<PathBuf>,
    /// The workspace: a directory holding its disk image (`disk.img`), mounted writable at
    /// /workspace. Give the same one again to resume the work (default: a new one).
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// The workspace's size, enforced by its filesystem (writing past it fails with ENOSPC);
    /// used when the image is first made.
    #[arg(long, value_name = "SIZE", default_value = "10240M", value_parser = crate::limits::parse_size)]
    pub(crate) disk: u64,
    /// The vault with Sandgate's CA and the credentials: needed when the policy has credential
    /// or git rules; when given, the sandbox also trusts Sandgate's CA.
    #[arg(long, value_name = "FILE", env = "SANDGATE_VAULT")]
    pub(crate) vault: Option<PathBuf>,
    /// The vault's key file; ignored when SANDGATE_VAULT_KEY is set.
    #[arg(long, value_name = "FILE", default_value = "sandgate-vault.key", env = "SANDGATE_VAULT_KEY_FILE")]
    pub(crate) vault_key_file: PathBuf,
    /// An extra CA (PEM) trusted for intercepted origins besides the system roots; repeatable.
    #[arg(long, value_name = "FILE", value_delimiter = ',')]
    pub(crate) upstream_ca: Vec<PathBuf>,
    /// The policy profile this sandbox gets (default: the policy's choice by address, which for
    /// a local sandbox is its `default` profile).
    #[arg(long, value_name = "NAME")]
    pub(crate) profile: Option<String>,
    /// Admin listener of this sandbox's proxy (`/metrics`, every series labelled with the
    /// sandbox id); none unless given.
    #[arg(long, value_name = "ADDR")]
    pub(crate) admin: Option<std::net::SocketAddr>,
    /// The isolation: `bwrap` (namespaces, default) or `gvisor` (gVisor's runsc: the command
    /// runs on a user-space kernel, so a kernel exploit does not reach the host's; needs runsc).
    #[arg(long, value_enum, default_value = "bwrap")]
    pub(crate) isolation: crate::run::Isolation,
    /// CPUs the sandbox may use (a CFS quota; fractions allowed).
    #[arg(long, value_name = "N", default_value_t = crate::limits::DEFAULT_CPUS)]
    pub(crate) cpus: f64,
    /// Memory limit, without swap (e.g. 2048M, 2G).
    #[arg(long, value_name = "SIZE", default_value = "2048M", value_parser = crate::limits::parse_size)]
    pub(crate) memory: u64,
    /// Most processes and threads the sandbox may have at once.
    #[arg(long, value_name = "N", default_value_t = crate::limits::DEFAULT_PIDS)]
    pub(crate) pids: u64,
    /// Lifetime, at most 6h; past it the sandbox is stopped and the reason printed.
    #[arg(long, value_name = "DURATION", default_value = "6h", value_parser = parse_lifetime)]
    pub(crate) lifetime: Duration,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// Policy file (YAML, `version: 1`); without it, the embedded default allowlist.
    #[arg(long, value_name = "FILE", env = "SANDGATE_POLICY")]
    pub(crate) policy: Option<PathBuf>,
    /// Explicit proxy listener (HTTP CONNECT and absolute-form HTTP): point HTTPS_PROXY here.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:4750", env = "SANDGATE_LISTEN")]
    pub(crate) listen: SocketAddr,
    /// Transparent listener, for connections redirected to it by nftables (REDIRECT).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:4751", env = "SANDGATE_TRANSPARENT")]
    pub(crate) transparent: SocketAddr,
    /// Do not open the transparent listener.
    #[arg(long)]
    pub(crate) no_transparent: bool,
    /// An SNI relay: `ADDR=PORT` accepts connections that were not redirected and dials the
    /// ClientHello's server name (or the HTTP Host) on PORT. Repeatable.
    #[arg(long, value_name = "ADDR=PORT", value_parser = parse_relay, env = "SANDGATE_SNI_RELAY", value_delimiter = ',')]
    pub(crate) sni_relay: Vec<(SocketAddr, u16)>,
    /// The vault holding the CA and the credentials (needed when the policy has credential or
    /// git rules).
    #[arg(long, value_name = "FILE", env = "SANDGATE_VAULT")]
    pub(crate) vault: Option<PathBuf>,
    /// The vault's key file; ignored when SANDGATE_VAULT_KEY is set.
    #[arg(long, value_name = "FILE", default_value = "sandgate-vault.key", env = "SANDGATE_VAULT_KEY_FILE")]
    pub(crate) vault_key_file: PathBuf,
    /// An extra CA (PEM) trusted for intercepted origins besides the system roots; repeatable.
    #[arg(long, value_name = "FILE", env = "SANDGATE_UPSTREAM_CA", value_delimiter = ',')]
    pub(crate) upstream_ca: Vec<PathBuf>,
    /// Admin listener: /metrics, /healthz, /readyz.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:4752", env = "SANDGATE_ADMIN")]
    pub(crate) admin: SocketAddr,
    /// DNS responder for sandboxes (UDP), where the sidecar's rules send their DNS: names the
    /// policy allows are answered, every other name gets NXDOMAIN. Off unless given.
    #[arg(long, value_name = "ADDR", env = "SANDGATE_DNS")]
    pub(crate) dns: Option<SocketAddr>,
    /// Do not open the admin listener.
    #[arg(long)]
    pub(crate) no_admin: bool,
    /// Worker threads serving connections (default: half the CPUs, at least one).
    #[arg(long, value_name = "N", env = "SANDGATE_WORKERS")]
    pub(crate) workers: Option<usize>,
    /// Upstream DNS server (`IP` or `IP:PORT`); repeatable. Default: /etc/resolv.conf.
    #[arg(long, value_name = "ADDR", value_parser = parse_dns, env = "SANDGATE_DNS_SERVER", value_delimiter = ',')]
    pub(crate) dns_server: Vec<SocketAddr>,
    /// Largest request head accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024, env = "SANDGATE_MAX_HEADER_BYTES")]
    pub(crate) max_header_bytes: usize,
    /// Time a client has to send a complete request head (slowloris defence).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, env = "SANDGATE_HEADER_TIMEOUT")]
    pub(crate) header_timeout: Duration,
    /// Largest TLS ClientHello accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 32 * 1024, env = "SANDGATE_MAX_HELLO_BYTES")]
    pub(crate) max_hello_bytes: usize,
    /// Time a client has to send a complete ClientHello once it started.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, env = "SANDGATE_HELLO_TIMEOUT")]
    pub(crate) hello_timeout: Duration,
    /// Time a transparent client may stay silent before it is judged by its address alone.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration, env = "SANDGATE_FIRST_BYTE_TIMEOUT")]
    pub(crate) first_byte_timeout: Duration,
    /// Time allowed for an upstream TCP connect.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, env = "SANDGATE_CONNECT_TIMEOUT")]
    pub(crate) connect_timeout: Duration,
    /// A tunnel with no traffic in either direction for this long is closed.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration, env = "SANDGATE_IDLE_TIMEOUT")]
    pub(crate) idle_timeout: Duration,
    /// Concurrent client connections in all (each tunnel uses two file descriptors).
    #[arg(long, value_name = "N", default_value_t = 9_500, env = "SANDGATE_MAX_CONNECTIONS")]
    pub(crate) max_connections: usize,
    /// Concurrent client connections from one source address.
    #[arg(long, value_name = "N", default_value_t = 4_096, env = "SANDGATE_MAX_CONNECTIONS_PER_CLIENT")]
    pub(crate) max_connections_per_client: usize,
    /// Time SIGTERM waits for live connections before exiting.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration, env = "SANDGATE_DRAIN_TIMEOUT")]
    pub(crate) drain_timeout: Duration,
    /// Node-agent mode for Kubernetes NODE (from the downward API's spec.nodeName): serve only
    /// Sandgate's sandbox pods on this node, each recognised by its pod IP and the token in its
    /// proxy URL (else 407) and given the profile its pod names. Explicit listener only. `*`
    /// serves the sandbox pods of every node (a Deployment instead of a DaemonSet). Needs a
    /// build with the `kubernetes` feature.
    #[arg(long, value_name = "NODE", env = "SANDGATE_NODE_NAME")]
    pub(crate) node_agent: Option<String>,
    /// The kubeconfig the node agent watches pods with (default: the in-cluster account).
    #[arg(long, value_name = "FILE", env = "SANDGATE_AGENT_KUBECONFIG", requires = "node_agent")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// How often the policy file is checked for changes.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, env = "SANDGATE_POLICY_POLL")]
    pub(crate) policy_poll: Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum PolicyCommand {
    /// Validate a policy file: exit 0 if it is usable, else print where and why (exit 65).
    Check {
        /// The policy file.
        file: PathBuf,
    },
    /// Show the decision a policy makes for one destination: verdict, rule, reason, profile.
    ///
    /// Exit status 0 when the connection would proceed (allow or report), 1 when denied.
    Explain {
        /// The policy file (`-` for the embedded default).
        file: PathBuf,
        /// The client's source address, which selects the profile.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
        from: std::net::IpAddr,
        /// The sandbox id the client sends as Proxy-Authorization user.
        #[arg(long, value_name = "ID")]
        user: Option<String>,
        /// The destination, `HOST:PORT` (IPv6 in brackets).
        destination: String,
    },
    /// Print the embedded default policy.
    Default,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write e.g. 500ms, 10s, 5m)"))
}

fn parse_lifetime(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > crate::limits::MAX_LIFETIME {
        return Err("a sandbox lives 6h at most".into());
    }
    if d.is_zero() {
        return Err("a lifetime must be longer than zero".into());
    }
    Ok(d)
}

fn parse_relay(s: &str) -> Result<(SocketAddr, u16), String> {
    let (addr, port) = s.rsplit_once('=').ok_or("write ADDR=PORT, e.g. 127.0.0.1:9444=443")?;
    let addr = addr.parse().map_err(|e| format!("`{addr}`: {e}"))?;
    let port = port.parse().map_err(|e| format!("`{port}`: {e}"))?;
    Ok((addr, port))
}

fn parse_dns(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| format!("`{s}` is not an IP address or IP:PORT"))
}
