# actionbus — the two commands a newcomer needs are `make demo` and `make test`.
GO      ?= go
FUZZTIME ?= 15s
PKG_FUZZ := ./internal/bus

.PHONY: all build test test-cluster soak demo bench lint fuzz examples ts clean

all: lint test

build:
	$(GO) build -o bin/ ./cmd/...

## demo: embedded NATS + all four services in one process, a real run with live progress.
demo:
	$(GO) run ./cmd/actionbus dev --port -1 --exit-after-demo

## test: the whole suite with the race detector, plus the separate example
## modules and the TypeScript SDK (whose node --test suite test/process runs
## against the real services).
test: examples ts
	$(GO) test -race -count=1 -timeout 30m ./...

## examples: the example modules outside the main one build and vet
## (binaries go to a temporary directory, never into the tree).
examples:
	for d in examples/custom-executor examples/client-app; do \
		(cd $$d && $(GO) vet ./... && $(GO) build -o "$$(mktemp -d)/" ./...) || exit 1; \
	done

## ts: install (npm ci, from the lockfiles) and build the TypeScript SDK
## and the TypeScript example executor; needs Node 20 and npm.
ts:
	cd sdk/typescript && npm ci --no-audit --no-fund && npm run build
	cd examples/ts-executor && npm ci --no-audit --no-fund && npm run build

## bench: Go benchmarks plus the end-to-end harness table.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
	$(GO) run ./bench

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## test-cluster: only the three-node cluster test (real nats-server
## processes, a node SIGKILLed under load); make test runs it too.
test-cluster:
	$(GO) test -race -count=1 -timeout 10m -run ThreeNode -v ./test/process/

## soak: the chaos soak at full size (about 6 minutes): 1 000 runs through
## real service processes while random ones are SIGKILLed and restarted
## for 300 s; make test runs a 60-second version.
soak:
	SOAK_SECONDS=300 SOAK_RUNS=1000 $(GO) test -count=1 -timeout 20m -run '^TestChaosSoak$$' -v ./test/process/

## fuzz: every fuzz target for a short bounded time.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) $(PKG_FUZZ)
	$(GO) test -run '^$$' -fuzz '^FuzzPercentRoundTrip$$' -fuzztime $(FUZZTIME) $(PKG_FUZZ)
	$(GO) test -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME) ./internal/workflow
	$(GO) test -run '^$$' -fuzz '^FuzzCheckBinding$$' -fuzztime $(FUZZTIME) ./events
	$(GO) test -run '^$$' -fuzz '^FuzzPrepareArgs$$' -fuzztime $(FUZZTIME) ./internal/actions
	$(GO) test -run '^$$' -fuzz '^FuzzExtractJSON$$' -fuzztime $(FUZZTIME) ./internal/planner
	$(GO) test -run '^$$' -fuzz '^FuzzCheckSQL$$' -fuzztime $(FUZZTIME) ./internal/builtin
	$(GO) test -run '^$$' -fuzz '^FuzzClean$$' -fuzztime $(FUZZTIME) ./internal/builtin
	$(GO) test -run '^$$' -fuzz '^FuzzTransitions$$' -fuzztime $(FUZZTIME) ./internal/run
	$(GO) test -run '^$$' -fuzz '^FuzzMarshalMatchesTheReference$$' -fuzztime $(FUZZTIME) ./internal/canonical
	$(GO) test -run '^$$' -fuzz '^FuzzFit$$' -fuzztime $(FUZZTIME) ./internal/audit
	$(GO) test -run '^$$' -fuzz '^FuzzClassRunsMatchAsRegexpDoes$$' -fuzztime $(FUZZTIME) ./internal/schema
	$(GO) test -run '^$$' -fuzz '^FuzzScannedPatternsMatchAsRegexpDoes$$' -fuzztime $(FUZZTIME) ./internal/schema
	$(GO) test -run '^$$' -fuzz '^FuzzGenericMatchesTheLibrary$$' -fuzztime $(FUZZTIME) ./internal/jsoncodec

clean:
	rm -rf bin bench/results
