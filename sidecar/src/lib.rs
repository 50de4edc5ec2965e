//! Making the proxy the only way out of a sandbox. The rules live on the gateway side of the
//! sandbox's veth (the host's namespace in production, a namespace of the test's own in tests),
//! never inside the sandbox, so root in the sandbox flushing its own rules changes nothing.
//!
//! [`rules`] renders the nftables ruleset as text from an [`AttachConfig`] (pure, golden-tested);
//! [`attach`] creates the sandbox's network namespace and veth and loads the rules, through an
//! [`attach::Run`] that tests can replace with a recorder. [`redirect`] is the same idea inside a
//! Kubernetes pod, for the sidecar's init container.

pub mod attach;
pub mod redirect;
pub mod rules;
pub mod webhook;

pub use attach::{AttachError, Attached, Run, System};
pub use rules::{AttachConfig, SandboxLink};
