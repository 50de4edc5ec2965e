//! End-to-end tests of the `sandgate` binary, compiled as one test binary (`cargo test -p
//! sandgate-tests`). Support builders start real origins on `127.0.0.1:0` with a per-test
//! rcgen PKI, spawn the proxy with a policy, and drive it with curl, git and rustls clients.

#[cfg(test)]
mod support;

#[cfg(test)]
mod e2e;
