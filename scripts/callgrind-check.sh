#!/usr/bin/env bash
# callgrind-check.sh: redis-server's instructions per Check (check.lua with
# three sliding windows, as make bench's "3 desc", or make bench's "4
# limits": a token bucket and an hourly window besides), counted by valgrind's
# callgrind: repeatable within about 1% whatever else the machine runs
# (Redis's own timer events fall in the count, and now and then a cycle of
# Lua's collector: one run in some twenty measured 10% more; compare medians
# of three or more runs), so a change to the Lua scripts can be measured on
# a shared machine.
#
#   scripts/callgrind-check.sh [PER_CALL [MIX]]   # Checks per call, default 4;
#                                                 # MIX 3desc (default), 4limits,
#                                                 # log1 or log100 (a sliding log),
#                                                 # or plain3desc (below)
#
# plain3desc sends, instead of calls of check.lua, the commands
# envoyproxy/ratelimit sends for the Checks of 3desc (INCRBY and EXPIRE per
# descriptor, in fixed windows, denied requests counted too), PER_CALL
# requests to a pipeline: what the same requests cost Redis without a
# script ("0 inside FCALL").
#
#   CALLGRIND_OUT=FILE scripts/callgrind-check.sh ...  # also keep the measured
#                                                 # pass's dump at FILE
#
# With CALLGRIND_OUT, `callgrind_annotate FILE` shows where the instructions
# go. Debian's redis-server is stripped, so Lua's functions show as
# addresses; a redis-server built from the same source with symbols (the
# Debian source package's redis_7.0.15.orig.tar.gz, `make MALLOC=libc
# BUILD_TLS=no`) first in PATH names them (docs/performance.md, "Redis
# instructions").
#
# It starts redis-server under callgrind on a free loopback port, runs
# BenchmarkCheckUnderCallgrind (pkg/redisbackend) against it, and prints the
# instructions of the measured pass divided by its Checks: in all, and inside
# FCALL. Needs valgrind and redis-server (scripts/install-deps.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PER_CALL="${1:-4}"
MIX="${2:-3desc}"
for tool in valgrind callgrind_annotate callgrind_control redis-server redis-cli python3; do
	command -v "$tool" >/dev/null || {
		echo "callgrind-check: $tool not found (apt-get install valgrind; scripts/install-deps.sh for Redis)" >&2
		exit 1
	}
done
TMP="$(mktemp -d)"
PID=""
cleanup() {
	if [ -n "$PID" ]; then
		kill "$PID" 2>/dev/null || true
		wait "$PID" 2>/dev/null || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
valgrind --tool=callgrind --callgrind-out-file="$TMP/callgrind.out" -q \
	redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/redis.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
	redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
	kill -0 "$PID" 2>/dev/null || {
		cat "$TMP/redis.log" >&2
		exit 1
	}
	sleep 0.1
done
# The benchmark zeroes and dumps this redis-server's counts only (by its
# pid): callgrind_control without one acts on every callgrind process of
# the machine, such as another run's.
out="$(cd "$ROOT" && ENVOY_RLS_CALLGRIND_REDIS="127.0.0.1:$PORT" ENVOY_RLS_CALLGRIND_PID="$PID" ENVOY_RLS_CALLGRIND_PER_CALL="$PER_CALL" ENVOY_RLS_CALLGRIND_MIX="$MIX" \
	go test -run '^$' -bench CheckUnderCallgrind -benchtime 1x ./pkg/redisbackend)" || {
	echo "$out" >&2
	exit 1
}
checks="$(echo "$out" | awk '/BenchmarkCheckUnderCallgrind/ { for (i = 1; i < NF; i++) if ($(i + 1) == "checks/dump") print int($i) }')"
dump="$TMP/callgrind.out.1"
[ -s "$dump" ] && [ -n "$checks" ] || {
	echo "$out" >&2
	echo "callgrind-check: no dump of the measured pass" >&2
	exit 1
}
if [ -n "${CALLGRIND_OUT:-}" ]; then
	cp "$dump" "$CALLGRIND_OUT"
fi
total="$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')"
# awk reads to the end: leaving early would end callgrind_annotate by
# SIGPIPE, which pipefail and set -e turn into a silent exit 141.
fcall="$(callgrind_annotate --inclusive=yes "$dump" | awk '/fcallCommand/ && !seen { gsub(",", "", $1); print $1; seen = 1 }')"
echo "callgrind-check: $MIX, $PER_CALL Checks per call, $checks Checks measured: $((total / checks)) instructions per Check, $((fcall / checks)) inside FCALL"
