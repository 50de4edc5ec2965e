#!/usr/bin/env bash
# Measures Sandgate intercepting HTTPS (TLS terminated with its CA, a credential injected,
# re-encrypted to the origin with full verification) against a direct connection and mitmproxy
# running a header-injecting addon, in one peerbench run. Usage:
#   benches/peerbench/run-intercept.sh [extra bench.py args...]
# Needs peerbench installed (benches/peerbench/run.sh does it) and openssl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${PEERBENCH_WORK:-/tmp/sandgate-peerbench}"
run="${PEERBENCH_RUN:-/tmp/peerbench-run}"
out="${PEERBENCH_OUT:-$root/target/peerbench/intercept-$(date +%Y%m%d-%H%M%S)}"
state="$(mktemp -d)"
trap 'rm -rf "$state"' EXIT

# peerbench's own origin certificate is self-signed with CA:TRUE, which no verifying client
# accepts as a server certificate. Give the origin a leaf from a CA of ours instead (peerbench
# keeps an existing certificate); the other peers do not verify the origin, so it changes
# nothing for them.
certs="$run/certs"
mkdir -p "$certs"
if [ ! -f "$certs/sandgate-origin-ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj /CN=peerbench-origin-ca -keyout "$state/ca.key" -out "$certs/sandgate-origin-ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
    -keyout "$certs/origin.key" -out "$state/origin.csr" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$state/ext"
  openssl x509 -req -in "$state/origin.csr" -CA "$certs/sandgate-origin-ca.pem" -CAkey "$state/ca.key" \
    -CAcreateserial -days 30 -extfile "$state/ext" -out "$certs/origin.crt" 2>/dev/null
fi

(cd "$root" && cargo build --release --bin sandgate -q)
sg="$root/target/release/sandgate"
export SANDGATE_VAULT="$state/vault.json" SANDGATE_VAULT_KEY_FILE="$state/vault.key"
"$sg" ca init >/dev/null
printf 'bench-token-0123456789' | "$sg" secret set bench-token 2>/dev/null
cat > "$state/policy.yaml" <<YAML
version: 1
resolve:
  localhost: [127.0.0.1]
allow:
  - hosts: [localhost]
    ports: [9443, 9080, 9500]
  - cidrs: [127.0.0.0/8]
    ports: [9443, 9080, 9500]
credentials:
  - name: bench
    hosts: [localhost]
    secret: bench-token
    scheme: bearer
YAML
ulimit -n 20000
mkdir -p "$(dirname "$out")"
"$sg" proxy --policy "$state/policy.yaml" --listen 127.0.0.1:3131 --no-transparent --admin 127.0.0.1:0 \
  --vault "$state/vault.json" --vault-key-file "$state/vault.key" --upstream-ca "$certs/sandgate-origin-ca.pem" \
  >"$out.conn.log" 2>"$out.diag.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$state"' EXIT
sleep 1
python3 "$work/bench.py" --peers mitm-intercept --proxy "sandgate-intercept=connect@127.0.0.1:3131,pid=$pid" \
  --workloads check,rate --rate-schemes https --rate-conc 1,64 --out "$out" "$@"
echo "results: $out/summary.md"
