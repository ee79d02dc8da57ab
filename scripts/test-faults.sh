#!/usr/bin/env bash
# `make test-faults`: the fault, hostile-input and security end-to-end tests alone, including the
# DynamoDB fault tests (against DynamoDB Local, started here as scripts/test.sh starts it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache
export DYNAMODB_LOCAL_STATE_DIR=.cache
if [ -z "${DYNAMODB_ENDPOINT:-}" ]; then
  if DYNAMODB_ENDPOINT=$(scripts/dynamodb-local.sh start); then
    export DYNAMODB_ENDPOINT
    trap 'scripts/dynamodb-local.sh stop >/dev/null 2>&1 || true' EXIT
  else
    echo "could not start DynamoDB Local (see .cache/dynamodb-local.log): the TestDynFault tests will be skipped"
  fi
fi
go test -race -count=1 -v \
  -run 'TestFault|TestDynFault|TestHostile|TestSecurity|TestBadConfigsServe|TestUpstreamAbortedBody' \
  ./test/e2e/ ./internal/testkit/faultnet/ ./internal/proxy/
