#!/usr/bin/env bash
# Redis for tests and development: Debian's redis-server, in memory, on free loopback ports.
#
#   scripts/redis.sh install          # apt-get install redis-server where it is missing (idempotent)
#                                     # (REDIS_SERVER_BIN: a Valkey or Redis built elsewhere)
#   scripts/redis.sh start            # one node; prints redis://127.0.0.1:PORT
#   scripts/redis.sh start cluster    # a 3-node cluster (3 primaries, no replicas); prints one
#                                     # redis://127.0.0.1:PORT line per node
#   scripts/redis.sh start sentinel   # a primary, one replica and one Sentinel (quorum 1, master
#                                     # name "rl"); prints the primary's, the replica's and the
#                                     # Sentinel's redis://127.0.0.1:PORT, one a line
#   scripts/redis.sh stop             # stop every node started in the state directory (idempotent)
#
# Every node runs without persistence (no RDB, no AOF): a restart starts empty, as a test wants.
#
# Environment:
#   REDIS_LOCAL_STATE_DIR  where the pid, port, config and log files live (default .cache/redis).
#                          Tests set it to a temporary directory so they own, and stop, only theirs.
#   REDIS_LOCAL_OWNER_PID  with start: the process the nodes are for (a test binary). A watcher
#                          stops them within about a second of that process's end.
#   REDIS_LOCAL_START_TIMEOUT  with start: seconds to wait for every node to answer (default 30).
#   REDIS_SERVER_BIN       the server binary instead of Debian's redis-server, e.g. a valkey-server
#                          built from source; install then checks it and installs nothing.
#   REDIS_CLI_BIN          the client for PING and cluster creation (default: the valkey-cli or
#                          redis-cli beside REDIS_SERVER_BIN, else redis-cli).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state="${REDIS_LOCAL_STATE_DIR:-$root/.cache/redis}"

die() { echo "redis-local: $*" >&2; exit 1; }

server_bin=${REDIS_SERVER_BIN:-redis-server}
cli_bin=${REDIS_CLI_BIN:-}
if [ -z "$cli_bin" ]; then
  cli_bin=redis-cli
  if [ -n "${REDIS_SERVER_BIN:-}" ]; then
    for c in "$(dirname "$REDIS_SERVER_BIN")/valkey-cli" "$(dirname "$REDIS_SERVER_BIN")/redis-cli"; do
      if [ -x "$c" ]; then cli_bin=$c; break; fi
    done
  fi
fi

install() {
  if [ -n "${REDIS_SERVER_BIN:-}" ]; then
    command -v "$server_bin" >/dev/null || die "REDIS_SERVER_BIN=$server_bin: not an executable"
    command -v "$cli_bin" >/dev/null || die "no client for $server_bin: set REDIS_CLI_BIN"
    return 0
  fi
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || die "redis-server not found and no apt-get: install Redis 7+ or Valkey 8+"
  if [ "$(id -u)" -ne 0 ]; then
    die "redis-server not found: run as root, or apt-get install redis-server"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server >&2 ||
    { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server >&2; } ||
    die "apt-get install redis-server failed"
}

# free_port prints a loopback port that is free, and whose cluster bus port (10000 above it) is
# free too: a cluster node needs both, and refuses ports above 55535.
free_port() {
  python3 - <<'PY'
import random, socket
for _ in range(200):
    p = random.randint(20000, 55535)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p); break
else:
    raise SystemExit("no free port")
PY
}

# node NAME [EXTRA redis.conf LINES...]: starts one redis-server in $state/NAME on a free port and
# prints the port. Its files: NAME/port, NAME/pid, NAME/log, NAME/redis.conf.
node() {
  local name=$1; shift
  local dir="$state/$name" port pid
  mkdir -p "$dir"
  port=$(free_port)
  {
    echo "port $port"
    echo "bind 127.0.0.1"
    echo "dir $dir"
    echo "save \"\""
    echo "appendonly no"
    echo "daemonize no"
    echo "protected-mode yes"
    local line
    for line in "$@"; do echo "$line"; done
  } >"$dir/redis.conf"
  # setsid: its own process group, so a test runner's signals do not reach it.
  setsid "$server_bin" "$dir/redis.conf" >"$dir/log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  echo "$port" >"$dir/port"
  watch_owner "$pid"
  echo "$port"
}

sentinel_node() {
  local name=$1 master_port=$2
  local dir="$state/$name" port pid
  mkdir -p "$dir"
  port=$(free_port)
  cat >"$dir/sentinel.conf" <<EOF
port $port
bind 127.0.0.1
dir $dir
sentinel monitor rl 127.0.0.1 $master_port 1
sentinel down-after-milliseconds rl 1000
sentinel failover-timeout rl 5000
sentinel parallel-syncs rl 1
EOF
  setsid "$server_bin" "$dir/sentinel.conf" --sentinel >"$dir/log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$dir/pid"
  echo "$port" >"$dir/port"
  watch_owner "$pid"
  echo "$port"
}

watch_owner() {
  [ -n "${REDIS_LOCAL_OWNER_PID:-}" ] || return 0
  # Every descriptor closed: whoever reads start's output must not wait for the watcher.
  setsid bash -c 'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done
    kill "$2" 2>/dev/null || true' watch "$REDIS_LOCAL_OWNER_PID" "$1" >/dev/null 2>&1 </dev/null &
}

wait_answers() {
  local name port deadline
  deadline=$((SECONDS + ${REDIS_LOCAL_START_TIMEOUT:-30}))
  for name in "$@"; do
    port=$(cat "$state/$name/port")
    until [ "$("$cli_bin" -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)" = PONG ]; do
      if ! kill -0 "$(cat "$state/$name/pid")" 2>/dev/null; then
        tail -20 "$state/$name/log" >&2 || true
        stop
        die "$name exited during start-up (log: $state/$name/log)"
      fi
      if [ "$SECONDS" -ge "$deadline" ]; then
        stop
        die "$name did not answer on port $port (log: $state/$name/log)"
      fi
      sleep 0.1
    done
  done
}

running() {
  local f
  for f in "$state"/*/pid; do
    [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && return 0
  done
  return 1
}

print_urls() {
  local name
  for name in "$@"; do echo "redis://127.0.0.1:$(cat "$state/$name/port")"; done
}

start() {
  local mode=${1:-single}
  install
  mkdir -p "$state"
  if running && [ -f "$state/mode" ] && [ "$(cat "$state/mode")" = "$mode" ]; then
    print_urls $(cat "$state/nodes")
    return 0
  fi
  stop
  mkdir -p "$state"
  echo "$mode" >"$state/mode"
  case "$mode" in
    single)
      node node0 >/dev/null
      echo node0 >"$state/nodes"
      wait_answers node0
      ;;
    cluster)
      local n addrs=()
      for n in 0 1 2; do
        node "cluster$n" "cluster-enabled yes" "cluster-config-file nodes.conf" \
          "cluster-node-timeout 2000" >/dev/null
      done
      echo "cluster0 cluster1 cluster2" >"$state/nodes"
      wait_answers cluster0 cluster1 cluster2
      for n in 0 1 2; do addrs+=("127.0.0.1:$(cat "$state/cluster$n/port")"); done
      "$cli_bin" --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$state/cluster-create.log" 2>&1 ||
        { cat "$state/cluster-create.log" >&2; stop; die "redis-cli --cluster create failed"; }
      local deadline=$((SECONDS + ${REDIS_LOCAL_START_TIMEOUT:-30}))
      for n in 0 1 2; do
        until "$cli_bin" -p "$(cat "$state/cluster$n/port")" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; do
          [ "$SECONDS" -lt "$deadline" ] || { stop; die "cluster did not reach cluster_state:ok"; }
          sleep 0.1
        done
      done
      ;;
    sentinel)
      local p
      p=$(node primary)
      wait_answers primary
      node replica "replicaof 127.0.0.1 $p" >/dev/null
      wait_answers replica
      sentinel_node sentinel0 "$p" >/dev/null
      echo "primary replica sentinel0" >"$state/nodes"
      wait_answers sentinel0
      ;;
    *) die "unknown mode $mode (single | cluster | sentinel)" ;;
  esac
  print_urls $(cat "$state/nodes")
}

stop() {
  local f pid
  for f in "$state"/*/pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$(dirname "$f")"
  done
  rm -f "$state/mode" "$state/nodes" "$state/cluster-create.log"
}

case "${1:-}" in
  install) install ;;
  start) start "${2:-single}" ;;
  stop) stop ;;
  *) echo "usage: $0 install|start [single|cluster|sentinel]|stop" >&2; exit 2 ;;
esac
