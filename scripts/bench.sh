#!/usr/bin/env bash
# bench.sh: measure envoy-rls on Redis with rls-bench and print one table.
#
# It builds envoy-rls and rls-bench into .tools/bin, starts on free loopback
# ports a throwaway redis-server (no persistence), envoy-rls with a generated
# `bench` domain, and a do-nothing RLS server in its own process
# (`rls-bench serve-noop`), then runs:
#
#   do-nothing    the ceiling: what gRPC + loopback + the generator allow,
#                 with one descriptor per request and with the three of
#                 "3 desc" (a descriptor costs the generator and the gRPC
#                 stack too, whatever the server does with it)
#   1 key         one descriptor, always the same key
#   100k keys     one descriptor over 100,000 keys (remote_address)
#   3 desc        three descriptors per request, one limit each: IP,
#                 tenant+user, route; 100,000 indexes
#   3 desc fixed  the same, counted in fixed windows (envoyproxy/ratelimit's
#                 algorithm; the others count in sliding windows)
#   4 limits      three descriptors where the middle one (plan+user) has two
#                 limits (a token bucket and an hourly window): 4 limits
#   hot key       one key whose tiny limit is exhausted: the OVER_LIMIT path
#   open loop     the 3-descriptor mix at a fixed BENCH_RATE (default 3000/s),
#                 latency from the intended send time (the tail under a steady
#                 offered load, without coordinated omission), and the
#                 do-nothing server under the same offered load (the tail
#                 the machine and the generator add by themselves)
#
# each closed-loop scenario at every BENCH_CALLERS (default "16 64") callers.
# The "ceiling" column is each run's rate as a fraction of the do-nothing
# server's at the same number of callers and descriptors per request.
#
# Server latency: on the envoy-rls rows rls-bench also scrapes envoy-rls's
# envoy_rls_request_duration_seconds before and after each measured phase and
# reports its p50 and p99 ("server p50/p99 ms", estimated from the
# histogram's buckets, 25 µs to 1 s, nine a decade): the time
# envoy-rls itself took to answer, without what gRPC's transport, the
# loopback, the kernel's scheduling and the generator add.
#
# CPU: rls-bench reads utime+stime from /proc/<pid>/stat of envoy-rls and
# redis-server just before and after each measured phase (warm-up excluded)
# and reports CPU µs per request ("rls µs/req", "redis µs/req"; "bench µs/req"
# is the generator itself). On the do-nothing rows the rls column is the
# do-nothing server's CPU: the floor a gRPC server pays per request. /proc
# counts in 10 ms ticks, so very short runs are coarse. The "wait µs/req"
# columns are each process's run-queue wait per request, summed over its
# threads (/proc/<pid>/task/*/schedstat): thread-time runnable but not
# running, a measure of how much the processes contend for the cores (not a
# share of each request's latency). "redis cmds/req" and "redis reads/req"
# are what Redis counted over the phase (INFO stats; a Cluster's masters
# added up): commands, those a script runs included, and read events, about
# one per round trip, per answered request. "idle %" and "steal %" are the whole
# machine's, over the same phase (/proc/stat): CPU time no process used, and
# CPU time the hypervisor gave to someone else while this VM had work. A run
# that lost 10% or more to steal is named on stderr: on a shared VM that is
# what makes two runs of the same code differ, so compare rows of similar
# steal.
#
# Environment:
#   BENCH_DURATION   measured phase of each run (default 5s; 2s for a quick look)
#   BENCH_REPEAT     rounds of every scenario (default 3), interleaved; the table
#                    shows the median of the rounds (a shared machine is noisy)
#   BENCH_WARMUP     warm-up of each run, discarded (default 2s)
#   BENCH_CALLERS    closed-loop caller counts (default "16 64")
#   BENCH_RATE       open-loop rate per second (default 3000)
#   BENCH_OPEN_CALLERS  bound on in-flight requests in the open-loop run (default 64)
#   BENCH_CONNECTIONS   gRPC connections of the generator (default 4)
#   BENCH_SCENARIOS  which to run, space-separated, from
#                    "ceiling one-key many-keys three-desc three-desc-fixed four-limits
#                    hot-key open-loop"
#                    (default all); "ceiling" alone needs neither Redis nor envoy-rls
#   BENCH_OUT        also write the JSON results (one object per run) to this file
#   BENCH_RLS_ARGS   extra envoy-rls flags, e.g. "--redis.senders -1" (word-split)
#   BENCH_RLS_ENV    extra environment of envoy-rls alone, e.g. "GOMAXPROCS=1"
#                    (word-split, given to env(1))
#   BENCH_REDIS      "single" (default): one redis-server; "unix": the same,
#                    reached over its Unix socket (envoy-rls on --redis.url
#                    unix://..., the incumbent on REDIS_SOCKET_TYPE=unix), as
#                    a Redis on the same host can be; "tls": the same,
#                    reached over TLS on its tls-port with a certificate of
#                    a CA made for the run by openssl(1) (envoy-rls on
#                    rediss://... with --redis.tls.ca, the incumbent on
#                    REDIS_TLS and REDIS_TLS_CACERT), as a managed Redis
#                    with in-transit encryption is; "cluster": a Redis
#                    Cluster of three masters (no replicas) made with
#                    redis-cli --cluster create, envoy-rls on
#                    --redis.cluster-addrs, and "redis µs/req" the sum over
#                    the three masters
#   BENCH_GRPC       "tcp" (default): the generator calls the servers (envoy-rls,
#                    the do-nothing server, the incumbent) on loopback TCP
#                    ports; "unix": on Unix sockets (envoy-rls --grpc.addr
#                    unix:..., the incumbent's GRPC_UDS), as an Envoy on the
#                    same host can (a pipe address); "tls": on loopback TCP
#                    ports over TLS, every server presenting a certificate
#                    for 127.0.0.1 of a CA made for the run by openssl(1)
#                    (envoy-rls --grpc.tls.cert/--grpc.tls.key, rls-bench
#                    serve-noop --tls.cert/--tls.key, the incumbent's
#                    GRPC_SERVER_USE_TLS, GRPC_SERVER_TLS_CERT and
#                    GRPC_SERVER_TLS_KEY) and the generator trusting that CA
#                    alone (rls-bench --tls.ca), as an Envoy reaching its
#                    rate-limit service over TLS does; with BENCH_REDIS=tls
#                    Redis presents the same certificate
#   BENCH_SERVER_HISTOGRAM  the envoy-rls histogram behind "server p50/p99 ms"
#                    (default envoy_rls_request_duration_seconds;
#                    envoy_rls_store_duration_seconds shows the wait for Redis)
#   BENCH_INCUMBENT  "1": also measure github.com/envoyproxy/ratelimit, side by
#                    side on the same Redis, with the same limits file
#                    (testdata/bench/bench.yaml, loaded unchanged by both):
#                    rows "ratelimit: ..." for every scenario it can express
#                    (all but "4 limits"). It is built once with `go install`
#                    at BENCH_INCUMBENT_VERSION into .tools/incumbent (from
#                    the Go module proxy). A path instead of "1" runs that
#                    binary. On its rows "rls µs/req" is its CPU, and there
#                    is no server latency (it exports no latency histogram).
#                    After the table a comparison sets envoy-rls against it,
#                    run against run (rls-bench report --compare
#                    "ratelimit: ")
#   BENCH_INCUMBENT_VERSION  the module version built for BENCH_INCUMBENT=1
#                    (default the newest commit on the proxy when this was
#                    written)
#   BENCH_INCUMBENT_ENV  extra environment of the incumbent (word-split),
#                    e.g. "REDIS_POOL_SIZE=20" (default 10). Its
#                    REDIS_PIPELINE_WINDOW applies to a Cluster only in the
#                    default version (radix v4 pipelines concurrent commands
#                    on a single node by itself).
#   BENCH_B_ARGS, BENCH_B_ENV  extra flags (word-split) and environment of a
#                    second envoy-rls, "B", on the same Redis with the same
#                    limits: every envoy-rls run is made against both, back
#                    to back ("B: ..." rows), and after the table a
#                    comparison sets B against the first, run against run
#                    (rls-bench report --compare "" --to "B: "), e.g.
#                    BENCH_B_ARGS="--redis.senders 1" measures that flag
#                    against the default. B's flags come after
#                    BENCH_RLS_ARGS (both instances get those): a flag
#                    given twice takes B's value
#   BENCH_B_REV      a git revision of this repository (a commit, branch or
#                    tag) to build B from instead of the working tree, which
#                    envoy-rls is always built from: BENCH_B_REV=main
#                    measures the main branch against your change (the
#                    comparison is B ÷ envoy-rls, so there a CPU ratio above
#                    1 means your change spends less). The limits files
#                    come from the working tree for both
#   BENCH_MAX_STEAL  the comparisons (with BENCH_INCUMBENT or BENCH_B_*) leave
#                    out the pairs of runs in which the hypervisor took this
#                    percentage or more of the machine's CPU time (default
#                    10; 0 keeps every pair)
#   BENCH_RETRY_STEAL  run a scenario's runs of a round again (the servers'
#                    runs back to back, or a do-nothing run) while one of
#                    them lost this percentage or more of the machine's CPU
#                    time to steal, up to BENCH_RETRIES times, and keep the
#                    calmest attempt: the one whose noisiest run lost least
#                    (default unset: never; a run takes up to 1 + BENCH_RETRIES
#                    times as long). On a shared VM whose steal comes and goes,
#                    BENCH_RETRY_STEAL=10 makes a table of calm rounds
#   BENCH_RETRIES    attempts after the first for BENCH_RETRY_STEAL (default 2)
#
# The servers of one scenario (envoy-rls, B, the incumbent) run back to back,
# and the one that goes first turns round by round, so each goes first as
# often as the others.
#
# Needs: go, redis-server in PATH (`make test` installs it, or
# scripts/install-deps.sh). Nothing else (no curl, no jq), but redis-cli
# for BENCH_REDIS=cluster and openssl for BENCH_REDIS=tls and BENCH_GRPC=tls
# (installed by the same).
#
# Note the machine: generator, envoy-rls, Redis and the do-nothing server share
# its cores, so on a small machine the figures are a comparison between
# scenarios, not a capacity statement.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Paths given relative to where make bench was run, before the cd below.
if [[ -n "${BENCH_OUT:-}" && "$BENCH_OUT" != /* ]]; then BENCH_OUT="$PWD/$BENCH_OUT"; fi
if [[ -n "${BENCH_INCUMBENT:-}" && "$BENCH_INCUMBENT" != 1 && "$BENCH_INCUMBENT" != /* ]]; then BENCH_INCUMBENT="$PWD/$BENCH_INCUMBENT"; fi
cd "$ROOT"

BENCH_DURATION="${BENCH_DURATION:-5s}"
BENCH_REPEAT="${BENCH_REPEAT:-3}"
BENCH_WARMUP="${BENCH_WARMUP:-2s}"
BENCH_CALLERS="${BENCH_CALLERS:-16 64}"
BENCH_RATE="${BENCH_RATE:-3000}"
BENCH_OPEN_CALLERS="${BENCH_OPEN_CALLERS:-64}"
BENCH_CONNECTIONS="${BENCH_CONNECTIONS:-4}"
SCENARIOS="ceiling one-key many-keys three-desc three-desc-fixed four-limits hot-key open-loop"
BENCH_SCENARIOS="${BENCH_SCENARIOS:-$SCENARIOS}"
BENCH_OUT="${BENCH_OUT:-}"
BENCH_RLS_ARGS="${BENCH_RLS_ARGS:-}"
BENCH_RLS_ENV="${BENCH_RLS_ENV:-}"
BENCH_SERVER_HISTOGRAM="${BENCH_SERVER_HISTOGRAM:-envoy_rls_request_duration_seconds}"
BENCH_REDIS="${BENCH_REDIS:-single}"
BENCH_GRPC="${BENCH_GRPC:-tcp}"
BENCH_INCUMBENT="${BENCH_INCUMBENT:-}"
BENCH_INCUMBENT_VERSION="${BENCH_INCUMBENT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}"
BENCH_INCUMBENT_ENV="${BENCH_INCUMBENT_ENV:-}"
BENCH_B_ARGS="${BENCH_B_ARGS:-}"
BENCH_B_ENV="${BENCH_B_ENV:-}"
BENCH_B_REV="${BENCH_B_REV:-}"
BENCH_MAX_STEAL="${BENCH_MAX_STEAL:-10}"
BENCH_RETRY_STEAL="${BENCH_RETRY_STEAL:-}"
BENCH_RETRIES="${BENCH_RETRIES:-2}"
# refuse NAME VALUE WANT: stop before any run, naming the setting.
refuse() {
	printf 'bench: %s=%s: want %s\n' "$1" "$2" "$3" >&2
	exit 2
}
percent_re='^(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)$'
case "$BENCH_REDIS" in
single | unix | tls | cluster) ;;
*) refuse BENCH_REDIS "$BENCH_REDIS" "single, unix, tls or cluster" ;;
esac
case "$BENCH_GRPC" in
tcp | unix | tls) ;;
*) refuse BENCH_GRPC "$BENCH_GRPC" "tcp, unix or tls" ;;
esac
[[ "$BENCH_MAX_STEAL" =~ $percent_re ]] || refuse BENCH_MAX_STEAL "$BENCH_MAX_STEAL" "a percentage from 0 to 100"
[[ -z "$BENCH_RETRY_STEAL" || "$BENCH_RETRY_STEAL" =~ $percent_re ]] ||
	refuse BENCH_RETRY_STEAL "$BENCH_RETRY_STEAL" "a percentage from 0 to 100, or nothing"
[[ "$BENCH_RETRIES" =~ ^[0-9]{1,2}$ ]] || refuse BENCH_RETRIES "$BENCH_RETRIES" "a number of attempts from 0 to 99"
duration_re='^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$'
[[ "$BENCH_DURATION" =~ $duration_re && ! "$BENCH_DURATION" =~ ^[0.]+[a-zµ]+$ ]] || refuse BENCH_DURATION "$BENCH_DURATION" "a positive duration (5s, 1m)"
[[ "$BENCH_WARMUP" =~ $duration_re ]] || refuse BENCH_WARMUP "$BENCH_WARMUP" "a duration, 0s or more"
[[ "$BENCH_REPEAT" =~ ^[1-9][0-9]*$ ]] || refuse BENCH_REPEAT "$BENCH_REPEAT" "a number of rounds, 1 or more"
[[ "$BENCH_RATE" =~ ^[0-9]+(\.[0-9]+)?$ && ! "$BENCH_RATE" =~ ^[0.]+$ ]] || refuse BENCH_RATE "$BENCH_RATE" "a positive rate per second"
[[ "$BENCH_OPEN_CALLERS" =~ ^[1-9][0-9]*$ ]] || refuse BENCH_OPEN_CALLERS "$BENCH_OPEN_CALLERS" "a number of callers, 1 or more"
[[ "$BENCH_CONNECTIONS" =~ ^[1-9][0-9]*$ ]] || refuse BENCH_CONNECTIONS "$BENCH_CONNECTIONS" "a number of connections, 1 or more"
read -r -a callers_list <<<"$(printf '%s' "$BENCH_CALLERS" | tr '\n\t' '  ')"
((${#callers_list[@]} > 0)) || refuse BENCH_CALLERS "$BENCH_CALLERS" "one or more numbers of callers"
for c in "${callers_list[@]}"; do
	[[ "$c" =~ ^[1-9][0-9]*$ ]] || refuse BENCH_CALLERS "$BENCH_CALLERS" "numbers of callers, 1 or more, separated by spaces"
done
BENCH_CALLERS="${callers_list[*]}"
# Scenario names separated by any blanks, one space each from here on.
read -r -a scenario_list <<<"$(printf '%s' "$BENCH_SCENARIOS" | tr '\n\t' '  ')"
((${#scenario_list[@]} > 0)) || refuse BENCH_SCENARIOS "$BENCH_SCENARIOS" "one or more of: $SCENARIOS"
BENCH_SCENARIOS="${scenario_list[*]}"
if [[ -n "$BENCH_OUT" ]]; then
	# Writable now, not after every run: cleanup would drop the results.
	: >>"$BENCH_OUT" 2>/dev/null || refuse BENCH_OUT "$BENCH_OUT" "a file that can be written"
fi

BIN="$ROOT/.tools/bin"
log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

want() { [[ " $BENCH_SCENARIOS " == *" $1 "* ]]; }
for s in $BENCH_SCENARIOS; do
	[[ " $SCENARIOS " == *" $s "* ]] || die "BENCH_SCENARIOS: unknown scenario \"$s\" (known: $SCENARIOS)"
done
needs_rls=0
for s in ${SCENARIOS#ceiling }; do
	if want "$s"; then needs_rls=1; fi
done

# --- processes we start, stopped on exit (by pid, nothing else) -------------
TMP="$(mktemp -d "${TMPDIR:-/tmp}/envoy-rls-bench.XXXXXX")"
PIDS=()
cleanup() {
	local pid
	# A second Ctrl-C must not cut the cleanup short (the folder stayed).
	trap '' INT TERM
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a loopback port nobody answers on, below Linux's
# ephemeral range (32768-60999), so that no outgoing connection of another
# process takes it meanwhile; a Redis Cluster node's bus port (+10000) stays
# below it too. A server that loses the race for it anyway is started again
# (launch).
free_port() {
	local p try
	for try in $(seq 1 100); do
		p=$((20000 + RANDOM % 2700))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	die "no free loopback port found"
}

# wait_until NAME PID LOGFILE CMD...: poll CMD every 0.1 s for up to 15 s
# while process PID lives; it fails if the process exits first, and stops
# the script if it is not ready in time.
wait_until() {
	local name="$1" pid="$2" logfile="$3"
	shift 3
	local i
	for i in $(seq 1 150); do
		if "$@" 2>/dev/null; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			return 1
		fi
		sleep 0.1
	done
	log "$name not ready after 15s; its log:"
	cat "$logfile" >&2
	exit 1
}

# launch NAME LOGFILE START READY: START starts a server in the background on
# ports it picks and sets LAUNCHED_PID; launch waits until READY succeeds. A
# server that exits because a port it picked was taken meanwhile is started
# again on other ports (5 attempts); any other exit stops the script with
# the server's log.
launch() {
	local name="$1" logfile="$2" start="$3" ready="$4" attempt
	for attempt in 1 2 3 4 5; do
		"$start"
		PIDS+=("$LAUNCHED_PID")
		if wait_until "$name" "$LAUNCHED_PID" "$logfile" "$ready"; then
			return 0
		fi
		if [ "$attempt" -lt 5 ] && grep -qi "address already in use" "$logfile"; then
			log "$name: a port it picked was taken meanwhile; starting it again"
			continue
		fi
		log "$name exited before it was ready; its log:"
		cat "$logfile" >&2
		exit 1
	done
}

tcp_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1"); }

redis_pong() ( # redis_pong PORT: the server answers PING
	exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
	printf 'PING\r\n' >&3
	IFS= read -r -t 1 line <&3 || exit 1
	[[ "$line" == "+PONG"* ]]
)

http_ok() ( # http_ok PORT PATH: the status line says 200
	exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
	printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
	IFS= read -r -t 2 line <&3 || exit 1
	[[ "$line" == "HTTP/1."?" 200"* ]]
)

# --- build -------------------------------------------------------------------
mkdir -p "$BIN"
log "building rls-bench"
go build -tags vtprotobuf -o "$BIN/rls-bench" ./cmd/rls-bench
if [ "$needs_rls" = 1 ]; then
	log "building envoy-rls"
	go build -tags vtprotobuf -o "$BIN/envoy-rls" ./cmd/envoy-rls ||
		die "envoy-rls does not build; BENCH_SCENARIOS=ceiling runs the do-nothing ceiling alone"
	B_BIN="$BIN/envoy-rls"
	if [ -n "$BENCH_B_REV" ]; then
		# The revision's tree, from git, built as the working tree is.
		B_COMMIT="$(git -C "$ROOT" rev-parse --verify --quiet "$BENCH_B_REV^{commit}")" ||
			die "BENCH_B_REV=$BENCH_B_REV: not a commit of this repository (git rev-parse)"
		log "building envoy-rls B at $BENCH_B_REV ($B_COMMIT)"
		mkdir -p "$TMP/b-src"
		git -C "$ROOT" archive "$B_COMMIT" | tar -x -C "$TMP/b-src" ||
			die "BENCH_B_REV=$BENCH_B_REV: git archive failed"
		B_BIN="$TMP/envoy-rls-b"
		(cd "$TMP/b-src" && go build -tags vtprotobuf -o "$B_BIN" ./cmd/envoy-rls) ||
			die "envoy-rls at BENCH_B_REV=$BENCH_B_REV does not build"
	fi
	command -v redis-server >/dev/null 2>&1 ||
		die "redis-server not found in PATH: run \`make test\` (it installs redis-server) or scripts/install-deps.sh"
	if [ "$BENCH_REDIS" = cluster ]; then
		command -v redis-cli >/dev/null 2>&1 ||
			die "redis-cli not found in PATH (BENCH_REDIS=cluster): run \`make test\` (it installs redis-tools) or scripts/install-deps.sh"
	fi
fi
# The certificates of the run (tls_files), for Redis or the gRPC servers.
needs_tls=0
if [ "$BENCH_GRPC" = tls ] || { [ "$BENCH_REDIS" = tls ] && [ "$needs_rls" = 1 ]; }; then
	needs_tls=1
	command -v openssl >/dev/null 2>&1 ||
		die "openssl not found in PATH (BENCH_REDIS=tls or BENCH_GRPC=tls): run \`make test\` (it installs openssl) or scripts/install-deps.sh"
fi
INC_BIN=""
if [ -n "$BENCH_INCUMBENT" ] && [ "$BENCH_INCUMBENT" != 0 ]; then
	# Refused before building it: the incumbent runs these only.
	inc_can=0
	for s in one-key many-keys three-desc hot-key open-loop; do
		if want "$s"; then inc_can=1; fi
	done
	[ "$inc_can" = 1 ] ||
		die "BENCH_INCUMBENT: BENCH_SCENARIOS=\"$BENCH_SCENARIOS\" has no scenario the incumbent can run (one-key, many-keys, three-desc, hot-key, open-loop)"
fi
case "$BENCH_INCUMBENT" in
"" | 0) ;;
1)
	INC_BIN="$ROOT/.tools/incumbent/$BENCH_INCUMBENT_VERSION/service_cmd"
	if [ ! -x "$INC_BIN" ]; then
		log "building github.com/envoyproxy/ratelimit@$BENCH_INCUMBENT_VERSION (once, into .tools/incumbent)"
		GOBIN="$(dirname "$INC_BIN")" go install "github.com/envoyproxy/ratelimit/src/service_cmd@$BENCH_INCUMBENT_VERSION" ||
			die "building envoyproxy/ratelimit failed"
	fi
	;;
*)
	INC_BIN="$BENCH_INCUMBENT"
	[ -x "$INC_BIN" ] || die "BENCH_INCUMBENT=$BENCH_INCUMBENT: want 1 or the path of an envoyproxy/ratelimit binary"
	;;
esac
if [ -n "$BENCH_B_ARGS$BENCH_B_ENV$BENCH_B_REV" ] && [ "$needs_rls" = 0 ]; then
	die "BENCH_B_ARGS/BENCH_B_ENV/BENCH_B_REV: BENCH_SCENARIOS=\"$BENCH_SCENARIOS\" has no scenario that runs envoy-rls"
fi

# --- servers -------------------------------------------------------------------
# tls_files: a CA made for this run and a certificate it signed for
# 127.0.0.1 (ECDSA P-256), in $TMP/tls: ca.pem, server.pem, server.key.
tls_files() {
	local d="$TMP/tls"
	mkdir -p "$d"
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$d/ext"
	{
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
			-subj "/CN=envoy-rls bench CA" -keyout "$d/ca.key" -out "$d/ca.pem" \
			-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign &&
			openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
				-subj "/CN=localhost" -keyout "$d/server.key" -out "$d/server.csr" &&
			openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
				-days 2 -extfile "$d/ext" -out "$d/server.pem"
	} >"$d/openssl.log" 2>&1 || {
		cat "$d/openssl.log" >&2
		die "openssl could not make the TLS certificates"
	}
}

# With BENCH_GRPC=tls, GRPC_TLS are the arguments of rls-bench's TLS to
# every server (the run's CA alone), and every server presents
# $TMP/tls/server.pem.
GRPC_TLS=()
if [ "$needs_tls" = 1 ]; then
	tls_files
fi
if [ "$BENCH_GRPC" = tls ]; then
	GRPC_TLS=(--tls.ca "$TMP/tls/ca.pem")
	log "gRPC over TLS: every server presents $TMP/tls/server.pem (for 127.0.0.1, signed by the run's CA); rls-bench ${GRPC_TLS[*]}"
fi

# socket NAME: the path of a Unix socket in $TMP, or the script stops if it is
# longer than a socket address holds.
socket() {
	local path="$TMP/$1.sock"
	[ "${#path}" -le 107 ] ||
		die "the Unix socket's path $path is longer than a socket address allows: set TMPDIR to a shorter directory"
	printf '%s' "$path"
}
# grpc_addr NAME: a gRPC address for a server, on a free loopback port or
# (BENCH_GRPC=unix) a Unix socket; grpc_ready ADDR: it accepts. That is
# ready with TLS too: a server reads its certificate before it listens.
grpc_addr() {
	local at
	if [ "$BENCH_GRPC" = unix ]; then
		at="$(socket "$1")" || exit 1
		printf 'unix:%s' "$at"
	else
		at="$(free_port)" || exit 1
		printf '127.0.0.1:%s' "$at"
	fi
}
grpc_ready() {
	case "$1" in
	unix:*) [ -S "${1#unix:}" ] ;;
	*) tcp_open "${1##*:}" ;;
	esac
}
NOOP_TLS=()
if [ "$BENCH_GRPC" = tls ]; then
	NOOP_TLS=(--tls.cert "$TMP/tls/server.pem" --tls.key "$TMP/tls/server.key")
fi
start_noop() {
	NOOP_ADDR="$(grpc_addr noop)"
	"$BIN/rls-bench" serve-noop --addr "$NOOP_ADDR" "${NOOP_TLS[@]}" >"$TMP/noop.log" 2>&1 &
	NOOP_PID=$!
	LAUNCHED_PID=$NOOP_PID
}
noop_ready() { grpc_ready "$NOOP_ADDR"; }
launch "rls-bench serve-noop" "$TMP/noop.log" start_noop noop_ready

# start_redis NAME ARGS...: a throwaway redis-server on a free port; sets
# REDIS_PORT and REDIS_PID.
start_redis() {
	REDIS_NAME="$1"
	shift
	REDIS_ARGS=("$@")
	mkdir -p "$TMP/$REDIS_NAME"
	launch "redis-server ($REDIS_NAME)" "$TMP/$REDIS_NAME.log" launch_redis redis_ready
}
launch_redis() {
	REDIS_PORT="$(free_port)"
	local tls=()
	if [ "$BENCH_REDIS" = tls ]; then
		# Plain TCP stays on REDIS_PORT, for the readiness probe.
		REDIS_TLS_PORT="$(free_port)"
		tls=(--tls-port "$REDIS_TLS_PORT" --tls-cert-file "$TMP/tls/server.pem" --tls-key-file "$TMP/tls/server.key"
			--tls-ca-cert-file "$TMP/tls/ca.pem" --tls-auth-clients no)
	fi
	rm -f "$TMP/$REDIS_NAME/nodes.conf"
	(cd "$TMP/$REDIS_NAME" && exec redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
		--daemonize no "${tls[@]}" "${REDIS_ARGS[@]}") >"$TMP/$REDIS_NAME.log" 2>&1 &
	REDIS_PID=$!
	LAUNCHED_PID=$REDIS_PID
}
redis_ready() { redis_pong "$REDIS_PORT"; }

cluster_ok() ( # cluster_ok PORT: CLUSTER INFO says cluster_state:ok
	exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
	printf 'CLUSTER INFO\r\n' >&3
	local line
	while IFS= read -r -t 1 line <&3; do
		[[ "$line" == cluster_state:ok* ]] && exit 0
		[[ "$line" == cluster_state:* ]] && exit 1
	done
	exit 1
)

if [ "$needs_rls" = 1 ]; then
	REDIS_PROBES=()
	if [ "$BENCH_REDIS" = cluster ]; then
		MASTERS=()
		for i in 1 2 3; do
			start_redis "redis$i" --cluster-enabled yes --cluster-config-file nodes.conf
			MASTERS+=("127.0.0.1:$REDIS_PORT")
			REDIS_PROBES+=(--cpu "redis=$REDIS_PID" --redis-stats "redis://127.0.0.1:$REDIS_PORT")
		done
		redis-cli --cluster create "${MASTERS[@]}" --cluster-replicas 0 --cluster-yes >"$TMP/cluster-create.log" 2>&1 || {
			cat "$TMP/cluster-create.log" >&2
			die "redis-cli --cluster create failed"
		}
		for p in "${MASTERS[@]}"; do
			wait_until "Redis Cluster" "$REDIS_PID" "$TMP/redis3.log" cluster_ok "${p##*:}" || {
				cat "$TMP/redis3.log" >&2
				die "a Redis Cluster master exited"
			}
		done
		REDIS_FLAG=(--redis.cluster-addrs "$(
			IFS=,
			echo "${MASTERS[*]}"
		)")
	elif [ "$BENCH_REDIS" = unix ]; then
		# Also on its TCP port, which the readiness probe uses.
		REDIS_SOCK="$(socket redis)"
		start_redis redis --unixsocket "$REDIS_SOCK" --unixsocketperm 700
		REDIS_PROBES+=(--cpu "redis=$REDIS_PID" --redis-stats "unix://$REDIS_SOCK")
		REDIS_FLAG=(--redis.url "unix://$REDIS_SOCK")
	elif [ "$BENCH_REDIS" = tls ]; then
		start_redis redis
		log "redis: plain TCP on $REDIS_PORT (the readiness probe's), TLS on $REDIS_TLS_PORT"
		REDIS_PROBES+=(--cpu "redis=$REDIS_PID" --redis-stats "redis://127.0.0.1:$REDIS_PORT")
		REDIS_FLAG=(--redis.url "rediss://127.0.0.1:$REDIS_TLS_PORT" --redis.tls.ca "$TMP/tls/ca.pem")
	else
		start_redis redis
		REDIS_PROBES+=(--cpu "redis=$REDIS_PID" --redis-stats "redis://127.0.0.1:$REDIS_PORT")
		REDIS_FLAG=(--redis.url "redis://127.0.0.1:$REDIS_PORT")
	fi

	mkdir -p "$TMP/config"
	cp "$ROOT"/testdata/bench/*.yaml "$TMP/config/"
	RLS_TLS=()
	if [ "$BENCH_GRPC" = tls ]; then
		RLS_TLS=(--grpc.tls.cert "$TMP/tls/server.pem" --grpc.tls.key "$TMP/tls/server.key")
	fi
	# start_rls: envoy-rls on ports it picks, with BENCH_RLS_ARGS and
	# BENCH_RLS_ENV, then START_EXTRA_ARGS and START_EXTRA_ENV (the second
	# one's; later flags win); sets START_ADDR, START_HTTP and LAUNCHED_PID.
	START_NAME=envoy-rls START_BIN="$BIN/envoy-rls" START_EXTRA_ARGS="" START_EXTRA_ENV=""
	start_rls() {
		START_ADDR="$(grpc_addr "$START_NAME")"
		START_HTTP="$(free_port)"
		env $BENCH_RLS_ENV $START_EXTRA_ENV "$START_BIN" serve \
			--config.dir "$TMP/config" \
			--grpc.addr "$START_ADDR" "${RLS_TLS[@]}" \
			--http.addr "127.0.0.1:$START_HTTP" \
			--debug.addr "127.0.0.1:$(free_port)" \
			"${REDIS_FLAG[@]}" \
			--log.level warn \
			$BENCH_RLS_ARGS $START_EXTRA_ARGS \
			>"$TMP/$START_NAME.log" 2>&1 &
		LAUNCHED_PID=$!
	}
	rls_ready() { http_ok "$START_HTTP" /readyz; }
	launch envoy-rls "$TMP/envoy-rls.log" start_rls rls_ready
	RLS_ADDR="$START_ADDR" RLS_HTTP="$START_HTTP" RLS_PID="$LAUNCHED_PID"
	log "redis ($BENCH_REDIS) ${REDIS_FLAG[*]}, envoy-rls pid $RLS_PID on $RLS_ADDR${RLS_TLS[*]:+ with ${RLS_TLS[*]}} (http :$RLS_HTTP), do-nothing pid $NOOP_PID on $NOOP_ADDR${NOOP_TLS[*]:+ with ${NOOP_TLS[*]}}"
	if [ -n "$BENCH_B_ARGS$BENCH_B_ENV$BENCH_B_REV" ]; then
		START_NAME=envoy-rls-b START_BIN="$B_BIN" START_EXTRA_ARGS="$BENCH_B_ARGS" START_EXTRA_ENV="$BENCH_B_ENV"
		launch "envoy-rls B" "$TMP/envoy-rls-b.log" start_rls rls_ready
		RLSB_ADDR="$START_ADDR" RLSB_HTTP="$START_HTTP" RLSB_PID="$LAUNCHED_PID"
		log "envoy-rls B (${BENCH_B_REV:+at $BENCH_B_REV $B_COMMIT, }${BENCH_B_ENV:+$BENCH_B_ENV }${BENCH_B_ARGS:-no other flags}) pid $RLSB_PID on $RLSB_ADDR (http :$RLSB_HTTP), on the same Redis"
	fi
fi

if [ -n "$INC_BIN" ]; then
	# envoyproxy/ratelimit reads $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config/*.yaml:
	# bench.yaml alone, as it is. Its settings are its defaults except the
	# ports (or socket, and TLS with BENCH_GRPC=tls), Redis over TCP (or the
	# Unix socket with BENCH_REDIS=unix, TLS with BENCH_REDIS=tls), no
	# statsd to send to, and its local cache of over-limit keys (1 MiB) for
	# the hot key.
	mkdir -p "$TMP/incumbent/ratelimit/config"
	cp "$ROOT/testdata/bench/bench.yaml" "$TMP/incumbent/ratelimit/config/"
	if [ "$BENCH_REDIS" = cluster ]; then
		INC_REDIS=(REDIS_SOCKET_TYPE=tcp REDIS_TYPE=CLUSTER "REDIS_URL=$(
			IFS=,
			echo "${MASTERS[*]}"
		)")
	elif [ "$BENCH_REDIS" = unix ]; then
		INC_REDIS=(REDIS_SOCKET_TYPE=unix REDIS_TYPE=SINGLE "REDIS_URL=$REDIS_SOCK")
	elif [ "$BENCH_REDIS" = tls ]; then
		INC_REDIS=(REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE "REDIS_URL=127.0.0.1:$REDIS_TLS_PORT"
			REDIS_TLS=true "REDIS_TLS_CACERT=$TMP/tls/ca.pem")
	else
		INC_REDIS=(REDIS_SOCKET_TYPE=tcp REDIS_TYPE=SINGLE "REDIS_URL=127.0.0.1:$REDIS_PORT")
	fi
	start_incumbent() {
		INC_ADDR="$(grpc_addr incumbent)"
		if [ "$BENCH_GRPC" = unix ]; then
			# It neither replaces nor removes a socket file: one left by
			# an earlier attempt would fail this one.
			rm -f "${INC_ADDR#unix:}"
			INC_GRPC=("GRPC_UDS=${INC_ADDR#unix:}")
		else
			INC_GRPC=(GRPC_HOST=127.0.0.1 "GRPC_PORT=${INC_ADDR##*:}")
		fi
		if [ "$BENCH_GRPC" = tls ]; then
			# It reads the pair again when a file in their directory
			# changes (none does during the run).
			INC_GRPC+=(GRPC_SERVER_USE_TLS=true "GRPC_SERVER_TLS_CERT=$TMP/tls/server.pem"
				"GRPC_SERVER_TLS_KEY=$TMP/tls/server.key")
		fi
		INC_HTTP="$(free_port)"
		INC_DEBUG="$(free_port)"
		env USE_STATSD=false LOG_LEVEL=warn \
			RUNTIME_ROOT="$TMP/incumbent" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
			"${INC_REDIS[@]}" LOCAL_CACHE_SIZE_IN_BYTES=1048576 \
			"${INC_GRPC[@]}" HOST=127.0.0.1 PORT="$INC_HTTP" \
			DEBUG_HOST=127.0.0.1 DEBUG_PORT="$INC_DEBUG" \
			$BENCH_INCUMBENT_ENV "$INC_BIN" >"$TMP/incumbent.log" 2>&1 &
		INC_PID=$!
		LAUNCHED_PID=$INC_PID
	}
	incumbent_ready() { http_ok "$INC_HTTP" /healthcheck; }
	launch "envoyproxy/ratelimit" "$TMP/incumbent.log" start_incumbent incumbent_ready
	log "envoyproxy/ratelimit ($INC_BIN) pid $INC_PID on $INC_ADDR (${INC_GRPC[*]}, http :$INC_HTTP), redis ${INC_REDIS[*]}"
fi

# --- runs ----------------------------------------------------------------------
RESULTS="$TMP/results.jsonl"
: >"$RESULTS"

# bench LABEL ARGS...: one rls-bench run, its JSON appended to the results.
bench() {
	local label="$1"
	shift
	log "run $round/$BENCH_REPEAT: $label"
	if ! "$BIN/rls-bench" --label "$label" --duration "$BENCH_DURATION" --warmup "$BENCH_WARMUP" \
		--connections "$BENCH_CONNECTIONS" --cpu bench=self --json "${GRPC_TLS[@]}" "$@" >>"$RESULTS" 2>"$TMP/run.err"; then
		cat "$TMP/run.err" >&2
		die "rls-bench failed: $label"
	fi
	# Its warnings (a run the hypervisor took much CPU from) go on.
	grep 'warning:' "$TMP/run.err" >&2 || true
}

# run_on SERVER LABEL ARGS...: one run against a server: "a" envoy-rls,
# "b" the second envoy-rls (BENCH_B_ARGS, rows "B: LABEL"), "inc" the
# incumbent (rows "ratelimit: LABEL").
run_on() {
	local server="$1" label="$2"
	shift 2
	case "$server" in
	a)
		bench "$label" "$@" --addr "$RLS_ADDR" --cpu "rls=$RLS_PID" "${REDIS_PROBES[@]}" \
			--server-metrics "http://127.0.0.1:$RLS_HTTP/metrics" --server-histogram "$BENCH_SERVER_HISTOGRAM"
		;;
	b)
		bench "B: $label" "$@" --addr "$RLSB_ADDR" --cpu "rls=$RLSB_PID" "${REDIS_PROBES[@]}" \
			--server-metrics "http://127.0.0.1:$RLSB_HTTP/metrics" --server-histogram "$BENCH_SERVER_HISTOGRAM"
		;;
	inc) bench "ratelimit: $label" "$@" --addr "$INC_ADDR" --cpu "rls=$INC_PID" "${REDIS_PROBES[@]}" ;;
	esac
}

# in_turn SERVER... -- LABEL ARGS...: the same run against each server, back
# to back, the order turned by one every round so that each server goes
# first as often as the others (a run just after another can find the
# machine warmer or cooler: an order effect of a few percent was seen).
in_turn() {
	local servers=() n i
	while [ "$1" != -- ]; do
		servers+=("$1")
		shift
	done
	shift
	n=${#servers[@]}
	for ((i = 0; i < n; i++)); do
		run_on "${servers[$(((i + round - 1) % n))]}" "$@"
	done
}

# rls_only LABEL ARGS...: a run against envoy-rls (and the second one)
# alone, for what the incumbent cannot express; rls LABEL ARGS...: against
# the incumbent too, with BENCH_INCUMBENT.
rls_only() { in_turn a ${RLSB_PID:+b} -- "$@"; }
rls() { in_turn a ${RLSB_PID:+b} ${INC_BIN:+inc} -- "$@"; }

# below A B: the number A is less than B.
below() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

# noisiest FILE: the largest share of the machine's CPU time that steal took
# during a run of FILE (rls-bench's "machine" figures; 0 without them).
noisiest() {
	local s
	s="$(grep -o '"steal_pct":[0-9.eE+-]*' "$1" | cut -d: -f2 | sort -g | tail -n 1)"
	printf '%s\n' "${s:-0}"
}

# pct X: the percentage X to one decimal, for the log.
pct() { awk -v x="$1" 'BEGIN { printf "%.1f%%", x }'; }

# calm CMD...: runs CMD, one scenario's runs of a round, whose results go to
# RESULTS. With BENCH_RETRY_STEAL, while one of its runs lost that
# percentage or more of the machine to steal, it runs CMD again, up to
# BENCH_RETRIES times, and keeps the results of the calmest attempt (the
# one whose noisiest run lost least; the first of equals); the others are
# dropped, so a row still has one result a round.
calm() {
	if [ -z "$BENCH_RETRY_STEAL" ]; then
		"$@"
		return
	fi
	local main="$RESULTS" RESULTS try best=0 least steal
	for ((try = 0; ; try++)); do
		RESULTS="$TMP/attempt.$try.jsonl"
		: >"$RESULTS"
		"$@"
		steal="$(noisiest "$RESULTS")"
		if ((try == 0)) || below "$steal" "$least"; then
			best=$try
			least=$steal
		fi
		if below "$steal" "$BENCH_RETRY_STEAL" || ((try >= BENCH_RETRIES)); then
			break
		fi
		log "round $round: a run lost $(pct "$steal") to steal (BENCH_RETRY_STEAL=$BENCH_RETRY_STEAL): again, attempt $((try + 2)) of $((BENCH_RETRIES + 1))"
	done
	if ((try > 0)); then
		log "round $round: kept attempt $((best + 1)) of $((try + 1)), whose noisiest run lost $(pct "$least") to steal"
	fi
	cat "$TMP/attempt.$best.jsonl" >>"$main"
}

THREE=(--descriptor 'remote_address=10.{i}' --descriptor 'tenant=t{i%100},user=u{i}' --descriptor 'route=/api/r{i%20}')
FOUR=(--descriptor 'remote_address=10.{i}' --descriptor 'plan=p{i%10},user=u{i}' --descriptor 'route=/api/r{i%20}')

for round in $(seq 1 "$BENCH_REPEAT"); do
	for c in $BENCH_CALLERS; do
		if want ceiling; then
			calm bench "do-nothing" --addr "$NOOP_ADDR" --is-ceiling --concurrency "$c" \
				--descriptor 'remote_address=10.{i}' --cpu "rls=$NOOP_PID"
			calm bench "do-nothing, 3 desc" --addr "$NOOP_ADDR" --is-ceiling --concurrency "$c" \
				"${THREE[@]}" --cardinality 100000 --cpu "rls=$NOOP_PID"
		fi
		if want one-key; then
			calm rls "1 key" --domain bench --concurrency "$c" --descriptor 'remote_address=10.0.0.1'
		fi
		if want many-keys; then
			calm rls "100k keys" --domain bench --concurrency "$c" --descriptor 'remote_address=10.{i}' --cardinality 100000
		fi
		if want three-desc; then
			calm rls "3 desc, 100k" --domain bench --concurrency "$c" "${THREE[@]}" --cardinality 100000
		fi
		if want three-desc-fixed; then
			calm rls_only "3 desc fixed, 100k" --domain bench_fixed --concurrency "$c" "${THREE[@]}" --cardinality 100000
		fi
		if want four-limits; then
			calm rls_only "4 limits, 100k" --domain bench4 --concurrency "$c" "${FOUR[@]}" --cardinality 100000
		fi
		if want hot-key; then
			calm rls "hot key (over)" --domain bench --concurrency "$c" --descriptor 'hot=1'
		fi
	done
	if want open-loop; then
		calm bench "do-nothing, open" --addr "$NOOP_ADDR" --rate "$BENCH_RATE" --concurrency "$BENCH_OPEN_CALLERS" \
			"${THREE[@]}" --cardinality 100000 --cpu "rls=$NOOP_PID"
		calm rls "open loop, 3 desc" --domain bench --rate "$BENCH_RATE" --concurrency "$BENCH_OPEN_CALLERS" "${THREE[@]}" --cardinality 100000
	fi
done

if [ -n "$BENCH_OUT" ]; then
	cp "$RESULTS" "$BENCH_OUT"
fi
echo
load="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
incumbent=""
if [ "$BENCH_INCUMBENT" = 1 ]; then
	incumbent=", envoyproxy/ratelimit $BENCH_INCUMBENT_VERSION"
elif [ -n "$INC_BIN" ]; then
	incumbent=", envoyproxy/ratelimit $INC_BIN"
fi
echo "envoy-rls bench: $(nproc 2>/dev/null || echo '?') CPUs (load average at the end: $load), Redis: $BENCH_REDIS, gRPC: $BENCH_GRPC$incumbent, medians of ${BENCH_REPEAT} rounds of ${BENCH_DURATION} measured after ${BENCH_WARMUP} warm-up, ${BENCH_CONNECTIONS} connections; latencies in ms"
"$BIN/rls-bench" report --median "$RESULTS"
# The comparisons: each pair of runs ran back to back, so their ratios are
# steadier than the ratio of the medians above. report --compare prints the
# runs' table first; sed drops it, up to the blank line after it.
if [ -n "$INC_BIN" ]; then
	echo
	"$BIN/rls-bench" report --compare "ratelimit: " --max-steal "$BENCH_MAX_STEAL" "$RESULTS" | sed '1,/^$/d'
fi
if [ -n "${RLSB_PID:-}" ]; then
	echo
	"$BIN/rls-bench" report --compare "" --to "B: " --max-steal "$BENCH_MAX_STEAL" "$RESULTS" | sed '1,/^$/d'
fi
