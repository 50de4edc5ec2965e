//! Benchmarks live in `benches/` (in-process, `cargo bench -p sandgate-benches`) and in
//! `peerbench/` (the proxy process against a direct connection and other proxies; see
//! `peerbench/run.sh`). This library is empty.
