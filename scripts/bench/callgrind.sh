# Sourced by the *-instr.sh scripts: a benchmark's cost per iteration in instructions, which
# callgrind counts the same on a quiet and on a loaded machine (scripts/bench/console-instr.sh
# explains the method and its settings).

# instr_proxy_test NAME: exits the script (0: skipped) without valgrind, else builds
# internal/proxy's test binary into INSTR_BIN. NAME is the calling script's, for the message.
# Call it directly, not in $(...): its exit must end the script.
instr_proxy_test() {
  if ! command -v valgrind >/dev/null; then
    echo "$1: valgrind is not installed (apt-get install valgrind); skipped" >&2
    exit 0
  fi
  mkdir -p .cache/bench/bin
  INSTR_BIN="$PWD/.cache/bench/bin/proxy.test"
  ${GO:-go} test -c -o "$INSTR_BIN" ./internal/proxy/
}

# instr_total TESTBIN DIR BENCH ITERATIONS: the instructions callgrind counted for the whole
# test process running BENCH (an exact -test.bench name) ITERATIONS times, in DIR.
instr_total() {
  (cd "$2" && GOGC=off GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1 valgrind --tool=callgrind \
    --callgrind-out-file=/dev/null "$1" -test.run '^$' -test.bench "^$3\$" \
    -test.benchtime "${4}x" -test.cpu 1 2>&1 >/dev/null) |
    awk '/Collected :/ { gsub(/,/, "", $NF); print $NF }'
}

# instr_per_op TESTBIN DIR BENCH N0 N: instructions per iteration, the difference of a run of N
# and one of N0 iterations over N - N0, which cancels start-up and set-up. Exits 2 when
# callgrind gave no count.
instr_per_op() {
  local lo hi
  lo=$(instr_total "$1" "$2" "$3" "$4")
  hi=$(instr_total "$1" "$2" "$3" "$5")
  if [ -z "$lo" ] || [ -z "$hi" ]; then
    echo "callgrind gave no count for $3" >&2
    exit 2
  fi
  echo $(((hi - lo) / ($5 - $4)))
}
