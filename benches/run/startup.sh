#!/usr/bin/env bash
# Time from `sandgate run` to CMD's first instruction, and teardown after CMD exits, p50 and
# p99 over N runs, next to bwrap alone and unshare alone in the same run. Root; it works inside
# a gateway namespace of its own, so the machine's root namespace is never changed.
#   benches/run/startup.sh [N]      (default 50)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
n="${1:-50}"
(cd "$root" && cargo build --release --bin sandgate -q)
sg="$root/target/release/sandgate"
gw="sg-bench-$$"
scratch="$(mktemp -d)"
ip netns add "$gw"; trap 'ip netns del "$gw"; rm -rf "$scratch"' EXIT
ip -n "$gw" link set lo up
now() { date +%s%N; }
stats() { sort -n | awk '{a[NR]=$1} END {p50=a[int((NR+1)*0.5)]; p99=a[int(NR*0.99)>0?int(NR*0.99):NR]; printf "p50 %.1f ms  p99 %.1f ms  (n=%d)\n", p50/1e6, p99/1e6, NR}'; }
measure() { # label, command... (the command prints its start time on fd 3)
  local label=$1; shift
  : > /tmp/sg-start.$$; : > /tmp/sg-stop.$$
  for _ in $(seq "$n"); do
    t0=$(now)
    t1=$("$@" 3>&1 >/dev/null 2>/dev/null)
    t2=$(now)
    echo $((t1 - t0)) >> /tmp/sg-start.$$
    echo $((t2 - t1)) >> /tmp/sg-stop.$$
  done
  printf '%-16s start:    %s\n' "$label" "$(stats < /tmp/sg-start.$$)"
  printf '%-16s teardown: %s\n' "" "$(stats < /tmp/sg-stop.$$)"
}
first='date +%s%N >&3'
# The workspace image is made once (as the target says: "with the workspace image already made").
run_sg() { nsenter --net="/var/run/netns/$gw" "$sg" run --state "$scratch/state" --workspace "$scratch/ws" "$@"; }
run_sg -- true 2>/dev/null
measure "sandgate run" run_sg -- sh -c "$first"
measure "bwrap alone" bwrap --ro-bind / / --dev /dev --proc /proc --unshare-pid --unshare-ipc --unshare-uts --unshare-net --die-with-parent -- sh -c "$first"
measure "unshare alone" unshare --net --pid --ipc --uts --fork -- sh -c "$first"
rm -f /tmp/sg-start.$$ /tmp/sg-stop.$$
