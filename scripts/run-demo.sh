#!/usr/bin/env bash
# Starts the demo upstream in the background and the gateway in the foreground with the example
# config; Ctrl-C stops both. Ports: proxy 8080, admin 9090, upstream 3000 (from configs/example.yaml;
# DEMO_LISTEN, DEMO_ADMIN_LISTEN and DEMO_UPSTREAM_LISTEN move them). Admin writes are on, with a
# demo token it prints (not a secret: the admin port is on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

proxy=${DEMO_LISTEN:-127.0.0.1:8080}
admin=${DEMO_ADMIN_LISTEN:-127.0.0.1:9090}
up=${DEMO_UPSTREAM_LISTEN:-127.0.0.1:3000}
export RATELIMIT_LISTEN=$proxy RATELIMIT_ADMIN_LISTEN=$admin RATELIMIT_UPSTREAM=http://$up
# The console's writes (admin reset, exempt) need a token: the CLI reads RATELIMIT_ADMIN_TOKEN.
export RATELIMIT_ADMIN_TOKEN_ENV=RATELIMIT_DEMO_ADMIN_TOKEN RATELIMIT_DEMO_ADMIN_TOKEN=demo-admin-token

./bin/demo-upstream -listen "$up" &
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

cat <<MSG
ratelimit-proxy on http://$proxy (admin: http://$admin/metrics), demo upstream on $up.
Try, in another terminal:
  curl -i http://$proxy/hello
  for i in \$(seq 15); do curl -s -o /dev/null -w '%{http_code} ' http://$proxy/; done; echo
  curl -s http://$admin/metrics | grep ^ratelimit_
Admin writes take the demo token demo-admin-token:
  RATELIMIT_ADMIN_TOKEN=demo-admin-token ./bin/ratelimit-proxy admin reset per-ip 127.0.0.1 --admin http://$admin
Ctrl-C stops both.
MSG
./bin/ratelimit-proxy serve --config configs/example.yaml &
gateway=$!
wait "$gateway"
