#!/usr/bin/env bash
# make sim: the deterministic simulator (internal/testkit/sim) on SIM_SEEDS seeds of
# SIM_DECISIONS decisions each on each backend (DynamoDB and Redis; SIM_BACKEND=dynamodb or
# redis for one), every mutant of each, and the differential tests of the simulated
# DynamoDB against DynamoDB Local (DYNAMODB_ENDPOINT, or one it starts) and of the simulated
# Redis against redis-server (REDIS_URL, or one it starts); writes
# .cache/sim/report.json (with each seed's history_sha256); runs the first SIM_REPEAT_SEEDS
# seeds (default 20) twice to show that each repeats its history byte for byte. SEED=N replays
# seed N alone (on SIM_BACKEND's backend, default dynamodb), prints its history_sha256, and its
# history when it fails (SIM_DECISIONS and SIM_HEAL_AT as the failure's replay command says).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache/sim
export SIM_SEEDS=${SIM_SEEDS:-100} SIM_DECISIONS=${SIM_DECISIONS:-2000}
export SIMDDB_DIFF_OUT=$PWD/.cache/sim/differential.json SIM_REPORT=$PWD/.cache/sim/report.json
if [ -n "${SEED:-}" ]; then
  export SIM_BACKEND=${SIM_BACKEND:-dynamodb}
  exec go test -count=1 -timeout 0 -v -run '^TestSimulator$' ./internal/testkit/sim/
fi
rm -f "$SIMDDB_DIFF_OUT"
export DYNAMODB_LOCAL_STATE_DIR=$PWD/.cache
go test -count=1 -timeout 30m -run '^TestDifferentialAgainstDynamoDBLocal$' -v ./internal/testkit/simddb/ | grep -E '^(---|ok|FAIL)|operations|mismatch|DynamoDB Local:|simddb:' || true
test -s "$SIMDDB_DIFF_OUT" || { echo "sim: the differential test wrote no counts"; exit 1; }
export SIMREDIS_DIFF_OUT=$PWD/.cache/sim/differential-redis.json
rm -f "$SIMREDIS_DIFF_OUT"
go test -count=1 -timeout 30m -run '^TestDifferentialAgainstRedis$' -v ./internal/testkit/simredis/ | grep -E '^(---|ok|FAIL)|operations|mismatch|redis-server' || true
export SIM_REPEAT_SEEDS=${SIM_REPEAT_SEEDS:-20}
go test -count=1 -timeout 0 -v -run '^(TestSimulator|TestSameSeedSameHistory)$' ./internal/testkit/sim/ >.cache/sim/sim.log 2>&1 && rc=0 || rc=$?
grep -E '^\s+sim_test.go:[0-9]+: ((dynamodb|redis) seed [0-9]+:|seed [0-9]+ \(|[0-9]+ runs|report)|^(ok|FAIL)\s' .cache/sim/sim.log | sed 's/^ *//'
cat "$SIM_REPORT" 2>/dev/null | head -40
exit $rc
