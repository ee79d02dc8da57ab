# ratelimit-proxy. `make run` tries the gateway; `make test` is what CI runs (.ci/run).
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin

.PHONY: all build image deps run test check lint unit test-faults soak bench bench-scale bench-rls bench-overload bench-redis check-exact sim profile-c profile-d schema clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ratelimit-proxy ./cmd/ratelimit-proxy
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ratelimit-replay ./cmd/ratelimit-replay
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/demo-upstream ./cmd/demo-upstream

## image: the container image the Helm chart runs by default (ratelimit-proxy:<the chart's
## appVersion>), built from the Dockerfile. IMAGE=registry/name:tag to name it otherwise.
CHART_APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deploy/helm/ratelimit-proxy/Chart.yaml)
IMAGE ?= ratelimit-proxy:$(CHART_APP_VERSION)
image:
	docker build -t $(IMAGE) --build-arg VERSION=$(VERSION) .

## run: the example config on the in-memory store, in front of the demo upstream.
run: build
	./scripts/run-demo.sh

## deps: the Debian packages the tests use (Java and npm for DynamoDB Local, curl, python3-flask,
## chromium), installed with apt-get when missing (root). make test names the missing ones and
## installs them only when CI=true or RATELIMIT_INSTALL_DEPS=1.
deps:
	./scripts/deps.sh install

## test: formatting, vet, lint, the static build, the race-enabled test suite, short fuzz runs;
## skipped tests are listed.
test: check lint build
	./scripts/test.sh

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./cmd/ratelimit-proxy validate --config configs/example.yaml

## lint: golangci-lint with the explicit linter list of .golangci.yml (installed into .tools/bin,
## pinned, on first use).
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := .tools/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)
lint: $(GOLANGCI_LINT)
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	mkdir -p .tools/bin
	GOBIN=$(CURDIR)/.tools/bin/tmp-$(GOLANGCI_LINT_VERSION) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv .tools/bin/tmp-$(GOLANGCI_LINT_VERSION)/golangci-lint $@ && rmdir .tools/bin/tmp-$(GOLANGCI_LINT_VERSION)

unit:
	$(GO) test -race -count=1 ./...

## test-faults: the fault, hostile-input and security end-to-end tests alone (the real binary,
## real sockets, a fault-injecting TCP proxy in front of the upstream or DynamoDB Local, which it
## starts). Also part of `make test`.
test-faults:
	./scripts/test-faults.sh

## soak: minutes of load against a flapping upstream and a config reloaded every 3 s; checks that
## goroutines and memory stay flat and the count stays exact. SOAK=10m make soak for longer.
SOAK ?= 2m
soak:
	RATELIMIT_SOAK=1 RATELIMIT_SOAK_DURATION=$(SOAK) $(GO) test -count=1 -v -timeout 0 -run 'TestSoak' ./test/e2e/

## bench: decision cost, the console's cost in instructions (valgrind), end to end vs a plain Go proxy
## (and nginx/HAProxy when installed), memory and DynamoDB cost, in one run; writes
## .cache/bench/results.md. BENCH_QUICK=1 for a ~1 minute smoke run.
bench:
	./scripts/bench/bench.sh

## bench-scale: shared pools at scale: 8 gateway processes on one DynamoDB Local table behind a
## relay that caps each item's writes (internal/testkit/ddbrelay), about twice the pool's rate offered for a
## steady and a load-shift phase; writes .cache/bench/scale.json and scale-phases.json (~1 minute).
## BENCH_SCALE_LEASE=0 for the baseline without leases; other knobs: go run ./scripts/bench/scale -h
bench-scale: build
	$(GO) run ./scripts/bench/scale

## check-exact: the adversary of the shared store: 3 gateway processes on one DynamoDB Local table
## behind a fault relay (dropped responses, duplicates, resets, delays, throttles, late writes,
## delayed duplicates, reordered writes), a replica SIGKILLed and restarted, offset clocks, every
## algorithm with leases on and off offered at least twice its bound, both group modes, the
## console's resets and exemptions meanwhile, then the memory store on one replica; checks the
## exact bound over every interval of the recorded history and writes .cache/check/exact.json
## (minutes). CHECK_EXACT_SELFTEST=1: the same scenario against mutants (the test gateway,
## internal/testkit/gateway, as each one), writes .cache/check/selftest.json. CHECK_EXACT_DURATION=30s per run; other knobs:
## go run ./scripts/check/exact -h. `make test` runs a short version (TestCheckExactShort).
## CHECK_EXACT_STORE=redis: the same on one redis-server behind TCP fault relays (connections reset,
## answers lost, delays), redis-server SIGKILLed and restarted empty (TestCheckExactRedisShort).
check-exact: build
	$(GO) build -o $(BIN)/ratelimit-test-gateway ./internal/testkit/gateway
	$(GO) run ./scripts/check/exact

## sim: the deterministic simulator (docs/simulator.md): replicas of the real engine against a
## simulated DynamoDB in one process on a fake clock, faults and interleavings from a seed; SIM_SEEDS
## seeds (default 150, about two minutes on 2 cores) of SIM_DECISIONS decisions (default 2000), every
## mutant, and the simulated DynamoDB's differential test against DynamoDB Local; writes
## .cache/sim/report.json. `make sim SEED=N` replays seed N and prints its history when it fails.
## `make test` runs a short budget of it.
sim:
	./scripts/sim.sh

## bench-rls: Envoy's rate limit service: BenchmarkDecision (the proxy's decision beside the RLS's,
## in process and over loopback gRPC) then the binary under a Go load generator over a pool of gRPC
## connections, 3 descriptors per call from 10,000 values, on memory and DynamoDB Local; writes
## .cache/bench/rls.md (~2 minutes). Knobs: go run ./scripts/bench/rls -h
bench-rls: build
	$(GO) run ./scripts/bench/rls

## bench-redis: Redis through gateways: 8 processes of the built binary on one redis-server
## (scripts/redis.sh), a load generator in front, for the proxy (HTTP) and the RLS (gRPC), on one
## key and over 10,000 keys, then paced at 5,000 decisions/s: decisions/s, p50/p99, CPU per
## decision of the gateways and of redis-server, their run-queue wait (the host's queue for its
## cores), redis-server's reads per decision (pipelining); with ERL_BIN=path/to/envoyproxy-ratelimit,
## their RLS beside ours on the same Redis and rules, load by load over 3 rounds (medians of the
## ratios), and a same-answers check. Then the store alone in this process (single, cluster,
## memory, DynamoDB Local when DYNAMODB_ENDPOINT names one). Writes .cache/bench/redis.json
## (~2 minutes, ~4 with ERL_BIN; docs/benchmarks.md says how to build theirs).
## Knobs: go run ./scripts/bench/redis -h
bench-redis: build
	$(GO) run ./scripts/bench/redis

## bench-overload: the upstream protection (protect block) under overload: an upstream of fixed
## capacity (queueing beyond it), load stepping 0.5x/1x/2x/4x with 20% critical, 60% default, 20%
## sheddable, then its capacity halved; no protection, a fixed limit and the adaptive limit side by
## side; writes .cache/bench/overload.json and overload.svg (~2 minutes). Knobs: go run ./scripts/bench/overload -h
bench-overload: build
	$(GO) run ./scripts/bench/overload

## profile-c / profile-d: pprof CPU and allocation profiles of the gateway under load (c) / (d).
profile-c:
	./scripts/bench/profile.sh c

profile-d:
	./scripts/bench/profile.sh d

## schema: regenerate configs/ratelimit-proxy.schema.json from the config structs in
## internal/policy/config.go (a test fails while it is stale).
schema:
	$(GO) generate ./internal/configschema/

clean:
	rm -rf $(BIN) .cache
