package main

import (
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
		"ENVOY_RLS_REDIS_CLUSTER_ADDRS":  "a:1, b:2,,c:3",
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
		o.store.redisClusterAddrs.String() != "a:1,b:2,c:3" || o.store.redisTimeout != 75*time.Millisecond ||
		o.store.fallbackInstances != 4 {
		t.Errorf("parsed %+v", o)
	}
	if o.configDir != "./config" || o.httpAddr != ":9090" || o.debugAddr != "127.0.0.1:6070" {
		t.Errorf("defaults changed: %+v", o)
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
