package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"redis.url":             "ENVOY_RLS_REDIS_URL",
		"redis.sentinel-master": "ENVOY_RLS_REDIS_SENTINEL_MASTER",
		"config.dir":            "ENVOY_RLS_CONFIG_DIR",
		"shadow":                "ENVOY_RLS_SHADOW",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestServeFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{
		"ENVOY_RLS_REDIS_URL":            "redis://10.0.0.1:6379",
		"ENVOY_RLS_GRPC_ADDR":            ":1111", // the command line wins
		"ENVOY_RLS_SHADOW":               "true",
		"ENVOY_RLS_REDIS_TIMEOUT":        "75ms",
		"ENVOY_RLS_FALLBACK_INSTANCES":   "4",
		"ENVOY_RLS_SOMETHING_IRRELEVANT": "x",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	o, err := parseServeFlags([]string{"--grpc.addr", ":2222"}, io.Discard, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if o.store.redisURL != "redis://10.0.0.1:6379" || o.grpcAddr != ":2222" || !o.shadow ||
		o.store.redisTimeout != 75*time.Millisecond || o.store.fallbackInstances != 4 {
		t.Errorf("parsed %+v", o)
	}
	// A list from the environment is split as on the command line.
	cluster := func(k string) (string, bool) {
		return "a:1, b:2,,c:3", k == "ENVOY_RLS_REDIS_CLUSTER_ADDRS"
	}
	if o, err := parseServeFlags(nil, io.Discard, cluster); err != nil || o.store.redisClusterAddrs.String() != "a:1,b:2,c:3" {
		t.Errorf("ENVOY_RLS_REDIS_CLUSTER_ADDRS: %v, %q", err, o.store.redisClusterAddrs.String())
	}
	if o.configDir != "./config" || o.httpAddr != ":9090" || o.debugAddr != "127.0.0.1:6070" {
		t.Errorf("defaults changed: %+v", o)
	}
	// Repeated list flags add up, and then the environment's value is not
	// read: the command line wins.
	o, err = parseServeFlags([]string{"--redis.url", "", "--redis.cluster-addrs", "d:4,e:5", "--redis.cluster-addrs", "f:6"}, io.Discard, lookup)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.store.redisClusterAddrs.String(); got != "d:4,e:5,f:6" {
		t.Errorf("--redis.cluster-addrs given twice: %s, want d:4,e:5,f:6", got)
	}
}

func TestServeFlagsBadEnvironmentNamesVariable(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "ENVOY_RLS_REDIS_TIMEOUT" {
			return "soon", true
		}
		return "", false
	}
	_, err := parseServeFlags(nil, io.Discard, lookup)
	if err == nil || !strings.Contains(err.Error(), "ENVOY_RLS_REDIS_TIMEOUT") {
		t.Fatalf("err = %v, want one naming ENVOY_RLS_REDIS_TIMEOUT", err)
	}
}

func TestUsageListsEveryFlagWithItsVariable(t *testing.T) {
	var b strings.Builder
	var o serveOptions
	fs := newServeFlags(&o, &b)
	fs.Usage()
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(b.String(), "--"+f.Name) || !strings.Contains(b.String(), "$"+envName(f.Name)) {
			t.Errorf("usage lacks --%s or $%s", f.Name, envName(f.Name))
		}
	})
	if n < 20 {
		t.Errorf("only %d flags", n)
	}
}

// TestServeFlagsOutOfRange: a value outside a flag's documented range is
// refused with the flag's name (from the command line or its variable), not
// quietly replaced by a default or taken as "no bound"; and a --redis.* flag
// without an address to connect to is refused rather than dropped while the
// service counts in memory (each instance alone: N× the limits).
func TestServeFlagsOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--config.reload-interval", "0s"}, want: "--config.reload-interval 0s: must be positive"},
		{args: []string{"--tls.check-interval", "-1m"}, want: "--tls.check-interval -1m0s: must be positive"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.timeout", "-1ms"}, want: "--redis.timeout -1ms: must be positive"},
		{args: []string{"--deny-cache.max-ttl", "-1s"}, want: "--deny-cache.max-ttl -1s: must be positive"},
		{args: []string{"--shutdown.drain-timeout", "-1s"}, want: "--shutdown.drain-timeout -1s"},
		{args: []string{"--log.repeat-interval", "-1s"}, want: "--log.repeat-interval -1s: must be 0 (every line) or more"},
		{args: []string{"--debug.top-capacity", "0"}, want: "--debug.top-capacity 0: must be 1 or more"},
		{args: []string{"--metrics.near-limit-ratio", "1.5"}, want: "--metrics.near-limit-ratio 1.5"},
		{args: []string{"--metrics.near-limit-ratio", "-0.1"}, want: "--metrics.near-limit-ratio -0.1"},
		{args: []string{"--metrics.near-limit-ratio", "NaN"}, want: "--metrics.near-limit-ratio NaN"},
		{args: []string{"--deny-cache.max-entries", "-1"}, want: "--deny-cache.max-entries -1"},
		{args: []string{"--fallback.instances", "-2"}, want: "--fallback.instances -2"},
		{args: []string{"--runtime.gc-percent", "0"}, want: "--runtime.gc-percent 0: must be 1 or more"},
		{args: []string{"--grpc.stream-workers", "-1"}, want: "--grpc.stream-workers -1: must be from 0 to 16384"},
		{args: []string{"--grpc.stream-workers", "4294967297"}, want: "--grpc.stream-workers 4294967297: must be from 0 to 16384"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.senders", "0"}, want: "--redis.senders 0: must be -1 (off) or 1 or more"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.senders", "-7"}, want: "--redis.senders -7: must be -1 (off) or 1 or more"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.max-batch", "0"}, want: "--redis.max-batch 0: must be 1 or more"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.key-prefix", ""}, want: `--redis.key-prefix "": must not be empty`},
		// An empty list of client names would leave mutual TLS open to
		// any certificate of the CA.
		{args: []string{"--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-ca", "ca"}, env: map[string]string{"ENVOY_RLS_GRPC_TLS_CLIENT_SAN": " , "}, want: `ENVOY_RLS_GRPC_TLS_CLIENT_SAN=" , ": no value`},
		{args: []string{"--grpc.conn-window", "-1"}, want: "--grpc.conn-window -1"},
		{args: []string{"--grpc.conn-window", "65534"}, want: "--grpc.conn-window 65534: must be 0 or from 65535"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.spare-after", "-1ms"}, want: "--redis.spare-after -1ms: must be 0 or more"},
		{env: map[string]string{"ENVOY_RLS_REDIS_SENTINEL_MASTER": "mymaster"}, want: "--redis.sentinel-master set, but no Redis to connect to"},
		{args: []string{"--redis.password", "x", "--redis.tls.ca", "ca.pem"}, want: "--redis.password, --redis.tls.ca set, but no Redis"},
		{args: []string{"--redis.url", "redis://h:1", "--redis.cluster-addrs", "h:2"}, want: "--redis.url and --redis.cluster-addrs are mutually exclusive"},
		{args: []string{"--redis.cluster-addrs", "h:2"}, env: map[string]string{"ENVOY_RLS_REDIS_SENTINEL_ADDRS": "h:3"}, want: "--redis.cluster-addrs and --redis.sentinel-addrs are mutually exclusive"},
		{args: []string{"--grpc.socket-mode", "0660"}, want: "--grpc.socket-mode is set, but --grpc.addr :8081 is no Unix socket"},
		{env: map[string]string{"ENVOY_RLS_GRPC_SOCKET_MODE": "0660"}, want: "--grpc.socket-mode is set, but --grpc.addr"},
		{args: []string{"--grpc.tls.cert", "tls.crt"}, want: "--grpc.tls.cert and --grpc.tls.key go together"},
		{env: map[string]string{"ENVOY_RLS_GRPC_TLS_KEY": "tls.key"}, want: "--grpc.tls.cert and --grpc.tls.key go together"},
		{args: []string{"--grpc.tls.client-ca", "ca.pem"}, want: "--grpc.tls.client-ca is set, but TLS is off"},
		{args: []string{"--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-san", "envoy"}, want: "--grpc.tls.client-san is set, but no --grpc.tls.client-ca"},
	} {
		lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		_, err := parseServeFlags(tc.args, io.Discard, lookup)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: %v, want a usage error containing %q", tc.args, tc.env, err, tc.want)
		}
	}
	// The flag package prints a bad value's error itself.
	var stderr strings.Builder
	_, err := parseServeFlags([]string{"--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-ca", "ca", "--grpc.tls.client-san", ""}, &stderr, func(string) (string, bool) { return "", false })
	if u := (usageError{}); !errors.As(err, &u) || !strings.Contains(stderr.String(), `invalid value "" for flag -grpc.tls.client-san: no value`) {
		t.Errorf("--grpc.tls.client-san \"\": %v, printed %q; want a usage error and the flag's", err, stderr.String())
	}
	// The boundaries of those ranges are accepted.
	for _, args := range [][]string{
		{"--shutdown.drain-timeout", "0s", "--metrics.near-limit-ratio", "0", "--deny-cache.max-entries", "0", "--log.repeat-interval", "0s"},
		{"--metrics.near-limit-ratio", "1", "--debug.top-capacity", "1", "--redis.sentinel-addrs", "h:26379", "--redis.sentinel-master", "m"},
		{"--grpc.stream-workers", "0", "--grpc.conn-window", "65535", "--runtime.gc-percent", "1"},
		{"--grpc.stream-workers", "16384", "--redis.url", "redis://h:1", "--redis.senders", "-1", "--redis.max-batch", "1"},
		{"--grpc.addr", "unix:/run/rls.sock", "--grpc.socket-mode", "0600"},
		{"--grpc.tls.cert", "c", "--grpc.tls.key", "k", "--grpc.tls.client-ca", "ca", "--grpc.tls.client-san", "envoy,spiffe://td/envoy"},
	} {
		if _, err := parseServeFlags(args, io.Discard, func(string) (string, bool) { return "", false }); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// TestGRPCSocketModeFlag: --grpc.socket-mode is read in octal, defaults to
// 0666, and a value that is no permission is refused with the flag's name.
func TestGRPCSocketModeFlag(t *testing.T) {
	o, err := parseServeFlags([]string{"--grpc.addr", "unix:/run/rls.sock"}, io.Discard, func(string) (string, bool) { return "", false })
	if err != nil || o.grpcMode != 0o666 {
		t.Errorf("default: mode %#o, %v; want 0666", uint32(o.grpcMode), err)
	}
	o, err = parseServeFlags([]string{"--grpc.addr", "unix:/run/rls.sock", "--grpc.socket-mode", "0660"}, io.Discard, func(string) (string, bool) { return "", false })
	if err != nil || o.grpcMode != 0o660 {
		t.Errorf("0660: mode %#o, %v", uint32(o.grpcMode), err)
	}
	for _, bad := range []string{"0999", "1777", "rw-rw----"} {
		var stderr strings.Builder
		_, err := parseServeFlags([]string{"--grpc.addr", "unix:/run/rls.sock", "--grpc.socket-mode", bad}, &stderr, func(string) (string, bool) { return "", false })
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(stderr.String(), "grpc.socket-mode") || !strings.Contains(stderr.String(), "octal permission") {
			t.Errorf("--grpc.socket-mode %s: %v, stderr %q; want a usage error naming the flag", bad, err, stderr.String())
		}
	}
}

// TestLogLevel: --log.level takes debug, info, warn or error, in any case;
// slog also reads offsets such as error+8, which hid every line, errors
// included, without a word (a review's finding).
func TestLogLevel(t *testing.T) {
	for _, level := range []string{"debug", "info", "warn", "error", "WARN"} {
		if _, err := newLogger(io.Discard, level, "text"); err != nil {
			t.Errorf("--log.level %s: %v", level, err)
		}
	}
	for _, level := range []string{"error+8", "info-4", "WARN+1", "verbose", ""} {
		if _, err := newLogger(io.Discard, level, "text"); err == nil || !strings.Contains(err.Error(), "want debug, info, warn or error") {
			t.Errorf("--log.level %q: %v, want it refused", level, err)
		}
	}
}
