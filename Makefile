# ratelimit-proxy. `make run` tries the gateway; `make test` is what CI runs (.ci/run).
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin

.PHONY: all build run test check unit fuzz bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ratelimit-proxy ./cmd/ratelimit-proxy
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/demo-upstream ./cmd/demo-upstream

## run: the example config on the in-memory store, in front of the demo upstream.
run: build
	./scripts/run-demo.sh

## test: formatting, vet, the static build, the race-enabled test suite, short fuzz runs; skipped
## tests are listed.
test: check build
	./scripts/test.sh

check:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./cmd/ratelimit-proxy validate --config configs/example.yaml

unit:
	$(GO) test -race -count=1 ./...

clean:
	rm -rf $(BIN) .cache
