#!/usr/bin/env bash
# `make profile-c` / `make profile-d`: CPU and allocation profiles of the gateway under load (c)
# (three layered policies, 10k rotating API keys, nothing rejected) or (d) (one hot key, every
# request rejected). The gateway is scripts/bench/gateway: the real server.Run wiring plus a
# pprof listener that exists only in that bench program (BENCH_PPROF). Profiles are written to
# .cache/bench/profile-<c|d>.{cpu,allocs}.pprof and summarised with `go tool pprof -top`.
#
#   scripts/bench/profile.sh c      PROFILE_SECONDS=20 scripts/bench/profile.sh d
set -euo pipefail
which=${1:?usage: profile.sh c|d}
case "$which" in c | d) ;; *) echo "usage: profile.sh c|d" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out="$root/.cache/bench"
mkdir -p "$out/bin"
GO=${GO:-go}
secs=${PROFILE_SECONDS:-10}
P_UP=18100 P_GW=18180 P_ADMIN=19190 P_PPROF=16060

if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then srv=(taskset -c 0); gen=(taskset -c 1); else srv=(); gen=(); fi

CGO_ENABLED=0 $GO build -trimpath -o "$out/bin/upstream" ./scripts/bench/upstream
CGO_ENABLED=0 $GO build -trimpath -o "$out/bin/gateway-pprof" ./scripts/bench/gateway
command -v wrk >/dev/null || CGO_ENABLED=0 $GO build -trimpath -o "$out/bin/loadgen" ./scripts/bench/loadgen

cat >"$out/profile.yaml" <<YAML
listen: 127.0.0.1:$P_GW
admin_listen: 127.0.0.1:$P_ADMIN
upstream: http://127.0.0.1:$P_UP
YAML
cat scripts/bench/policyset.yaml >>"$out/profile.yaml" # loads (c)/(d): the hot key is "hot-key"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"${gen[@]}" "$out/bin/upstream" -listen 127.0.0.1:$P_UP >"$out/profile-upstream.log" 2>&1 &
pids+=($!)
BENCH_PPROF=127.0.0.1:$P_PPROF "${srv[@]}" "$out/bin/gateway-pprof" -config "$out/profile.yaml" >"$out/profile-gateway.log" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 20))
until curl -s -o /dev/null "http://127.0.0.1:$P_GW/" && curl -s -o /dev/null "http://127.0.0.1:$P_PPROF/debug/pprof/"; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "profile: gateway did not start (see $out/profile-gateway.log)" >&2; exit 1; }
  sleep 0.1
done

keys=10000 hot=""
[ "$which" = d ] && keys=0 hot=hot-key
if command -v wrk >/dev/null; then
  BENCH_KEYS=$keys BENCH_HOT=$hot "${gen[@]}" wrk -t1 -c64 -d"$((secs + 3))s" -s scripts/bench/wrk.lua "http://127.0.0.1:$P_GW/" >"$out/profile-$which.load.txt" &
else
  "${gen[@]}" "$out/bin/loadgen" -url "http://127.0.0.1:$P_GW/" -c 64 -d "$((secs + 3))s" -keys "$keys" -hot "$hot" >"$out/profile-$which.load.txt" &
fi
lp=$!
sleep 1 # let the load reach steady state before sampling
curl -s -o "$out/profile-$which.cpu.pprof" "http://127.0.0.1:$P_PPROF/debug/pprof/profile?seconds=$secs"
curl -s -o "$out/profile-$which.allocs.pprof" "http://127.0.0.1:$P_PPROF/debug/pprof/allocs"
wait "$lp"
grep '^RESULT' "$out/profile-$which.load.txt" || true
echo "== CPU ($out/profile-$which.cpu.pprof), top by cumulative then flat =="
$GO tool pprof -top -cum -nodecount=30 "$out/bin/gateway-pprof" "$out/profile-$which.cpu.pprof" 2>/dev/null | sed -n '1,40p'
$GO tool pprof -top -nodecount=25 "$out/bin/gateway-pprof" "$out/profile-$which.cpu.pprof" 2>/dev/null | sed -n '6,32p'
echo "== allocations since start ($out/profile-$which.allocs.pprof), by objects =="
$GO tool pprof -top -sample_index=alloc_objects -nodecount=25 "$out/bin/gateway-pprof" "$out/profile-$which.allocs.pprof" 2>/dev/null | sed -n '1,32p'
