#!/usr/bin/env bash
# The upstream protection's CPU cost per proxied request, counted in instructions (issue 25:
# at most 5% of the proxy's): BenchmarkHandler_Protect/{off,fixed,adaptive} (internal/proxy)
# under callgrind, with console-instr.sh's method (scripts/bench/callgrind.sh). make bench calls
# it; docs/benchmarks.md records its numbers.
#
#   scripts/bench/protect-instr.sh        # prints a markdown table, exits 1 over the target
#   PROTECT_INSTR_N=60000 scripts/bench/protect-instr.sh   # longer (default 30000)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/bench/callgrind.sh
n=${PROTECT_INSTR_N:-30000}
n0=$((n / 6))
target=${PROTECT_INSTR_TARGET:-1.05}
instr_proxy_test protect-instr
bin=$INSTR_BIN

off=$(instr_per_op "$bin" internal/proxy BenchmarkHandler_Protect/off "$n0" "$n")
over=0
echo "| protection | instructions/request | vs. off |"
echo "|---|---:|---:|"
echo "| off | $off | |"
for m in fixed adaptive; do
  per=$(instr_per_op "$bin" internal/proxy "BenchmarkHandler_Protect/$m" "$n0" "$n")
  ratio=$(awk -v a="$per" -v b="$off" 'BEGIN { printf "%.3f", a / b }')
  echo "| $m | $per | $ratio |"
  if awk -v r="$ratio" -v t="$target" 'BEGIN { exit !(r > t) }'; then over=1; fi
done
echo
echo "callgrind, GOGC=off, -benchtime ${n0}x and ${n}x, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC'); target <= $target"
exit "$over"
