#!/usr/bin/env bash
# The operators' console's CPU cost per proxied request, counted in instructions: the target is
# "the proxy's hot path costs at most 5% more CPU per request with the console on, measured side
# by side in one run". Wall-clock and CPU-time ratios on a shared 2-core machine vary by ±15%;
# an instruction count does not, so each variant of BenchmarkHandlerConsole (internal/proxy:
# admitted and rejected, console off and on) runs under valgrind's callgrind, which counts every
# instruction the process executes. make bench calls it; docs/benchmarks.md records its numbers.
#
# Two clocks (BenchmarkHandlerConsole's doc): "load", every request past a policy's first 1,000
# charges of a second, where the console's sketch samples; "light", at most 1,000 a second,
# where it counts every charge. The target is checked under load: under light load the console
# costs more per request, but at most 1,000 charges a second of each policy, a bounded and
# small amount of CPU (docs/benchmarks.md gives it).
#
#   scripts/bench/console-instr.sh           # prints a markdown table, exits 1 over the target
#   CONSOLE_INSTR_N=60000 scripts/bench/console-instr.sh   # longer, steadier (default 30000)
#
# Method: each variant runs twice, with -benchtime N/6x and Nx, and the per-request count is the
# difference of the two totals over the difference of the iterations, which cancels the
# process's start-up, the test binary's set-up and the benchmark's first b.N=1 round. GOGC=off:
# the console allocates nothing, so the garbage collector's work per request is the same on and
# off, but its cycles land at different iterations from run to run and move a total by ±3%;
# without them the counts repeat to 0.1%, and the ratio, with the equal GC work left out of both,
# is the stricter one. GODEBUG=cpu.rdtscp=off: valgrind 3.19 cannot decode the RDTSCP that the Go
# runtime reads its tick counter with. -test.cpu 1: one goroutine serves, as valgrind runs one
# thread at a time anyway. Repeated runs of one variant still differ by about 25 instructions
# per request (0.1% admitted, 0.3% on the 429 path), likely the Go runtime's background work,
# which is timed by the wall clock that valgrind stretches.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/bench/callgrind.sh
n=${CONSOLE_INSTR_N:-30000}
# The shorter run must already be past a policy's first 1,000 charges of the standing second.
n0=$((n / 6 > 1000 ? n / 6 : 1000))
if [ "$n" -le "$n0" ]; then
  echo "console-instr: CONSOLE_INSTR_N must be above $n0" >&2
  exit 2
fi
target=${CONSOLE_INSTR_TARGET:-1.05}

instr_proxy_test console-instr
bin=$INSTR_BIN

over=0
echo "| path | clock | console off, instructions/request | console on | on / off |"
echo "|---|---|---:|---:|---:|"
for path in admitted rejected; do
  for clock in load light; do
    declare -A per=()
    for m in off on; do
      per[$m]=$(instr_per_op "$bin" internal/proxy "BenchmarkHandlerConsole/$path/$clock/console=$m" "$n0" "$n")
    done
    ratio=$(awk -v a="${per[on]}" -v b="${per[off]}" 'BEGIN { printf "%.3f", a / b }')
    echo "| $path | $clock | ${per[off]} | ${per[on]} | $ratio |"
    # The target is checked under load, where the CPU per request adds up (see the header).
    if [ "$clock" = load ] && awk -v r="$ratio" -v t="$target" 'BEGIN { exit !(r > t) }'; then over=1; fi
  done
done
echo
echo "callgrind, GOGC=off, -benchtime ${n0}x and ${n}x, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes'), $(date -u '+%Y-%m-%d %H:%M UTC'); target on / off <= $target under load"
exit "$over"
