#!/usr/bin/env bash
# Measures Sandgate against a direct connection and other proxies with ../shared/peerbench,
# in one run on loopback. Usage:
#   benches/peerbench/run.sh [PEERS] [extra bench.py args...]
#   benches/peerbench/run.sh squid,tinyproxy,srt,nginx-sni,haproxy-sni --reps 3
# PEERS defaults to "squid,tinyproxy,srt,nginx-sni,haproxy-sni". Results go to
# $PEERBENCH_OUT (default target/peerbench/run-<time>). Needs root for the peers' installs
# (peerbench's install.sh) and a 20,000 open-file limit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
src="${PEERBENCH_SRC:-$root/../shared/peerbench}"
work="${PEERBENCH_WORK:-/tmp/sandgate-peerbench}"
peers="${1:-squid,tinyproxy,srt,nginx-sni,haproxy-sni}"
shift || true
out="${PEERBENCH_OUT:-$root/target/peerbench/run-$(date +%Y%m%d-%H%M%S)}"

# shared/ is read-only: work on a copy (pbtool builds into its own directory).
if [ ! -x "$work/pbtool/target/release/pbtool" ]; then
  rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
  (cd "$work" && ./install.sh)
fi
(cd "$root" && cargo build --release --bin sandgate -q)
ulimit -n 20000
mkdir -p "$(dirname "$out")"

# The peers and the origin take 3128/9443/9500...; Sandgate listens on 3129 (CONNECT),
# 9444 and 9544 (SNI relays to the origin and the sink), as peerbench's README describes.
"$root/target/release/sandgate" proxy --policy "$here/policy.yaml" \
  --listen 127.0.0.1:3129 --no-transparent --admin 127.0.0.1:0 \
  --sni-relay 127.0.0.1:9444=9443 --sni-relay 127.0.0.1:9544=9500 \
  --max-connections 19000 --max-connections-per-client 19000 \
  >"$out.conn.log" 2>"$out.diag.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
sleep 1
python3 "$work/bench.py" --peers "$peers" \
  --proxy "sandgate=connect@127.0.0.1:3129,pid=$pid" \
  --proxy "sandgate-sni=sni@127.0.0.1:9444,bulk=127.0.0.1:9544,pid=$pid" \
  --out "$out" "$@"
echo "results: $out/summary.md"
