#!/usr/bin/env bash
# Starts the demo upstream in the background and the gateway in the foreground with the example
# config; Ctrl-C stops both. Ports: proxy 8080, admin 9090, upstream 3000 (from configs/example.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."

./bin/demo-upstream -listen 127.0.0.1:3000 &
upstream=$!
gateway=
# Both stop however this script ends: Ctrl-C (the terminal signals the whole group), a SIGTERM
# sent to make or to this script alone (make forwards it to this shell only), or the gateway
# failing to start.
cleanup() {
  kill ${gateway:+"$gateway"} "$upstream" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 143' TERM HUP
trap 'wait 2>/dev/null; exit 130' INT

cat <<'MSG'
ratelimit-proxy on http://127.0.0.1:8080 (admin: http://127.0.0.1:9090/metrics), demo upstream on :3000.
Try, in another terminal:
  curl -i http://127.0.0.1:8080/hello
  for i in $(seq 15); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:8080/; done; echo
  curl -s http://127.0.0.1:9090/metrics | grep ^ratelimit_
Ctrl-C stops both.
MSG
./bin/ratelimit-proxy serve --config configs/example.yaml &
gateway=$!
wait "$gateway"
