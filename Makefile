# Targets that need servers wrap themselves in scripts/with-servers.sh, which
# starts throwaway servers on loopback (a Redis, a Redis Cluster of three
# primaries and three replicas, a Sentinel group of a primary, a replica and
# three Sentinels, and Postgres; installing them with apt-get as root when
# missing) and removes them afterwards.

# Newest staticcheck that builds with this module's Go (1.26); bump on purpose.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := bin/staticcheck
# One stamp per version, so bumping STATICCHECK_VERSION reinstalls.
STATICCHECK_STAMP := bin/.staticcheck-$(STATICCHECK_VERSION)

.PHONY: tools check test test-inner chaos bench bench-adapt demo

# tools: download Go module deps and install the pinned staticcheck into ./bin.
tools: $(STATICCHECK) $(STATICCHECK_STAMP)
	go mod download

# Grouped target (&:): reinstall when the binary or this version's stamp is missing.
$(STATICCHECK) $(STATICCHECK_STAMP) &:
	GOBIN=$(CURDIR)/bin go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	rm -f bin/.staticcheck-*
	touch $(STATICCHECK_STAMP)

# check: gofmt (tracked and new files), go vet and staticcheck.
check: $(STATICCHECK) $(STATICCHECK_STAMP)
	@files="$$(git ls-files --cached --others --exclude-standard -- '*.go' 2>/dev/null || \
		find . -name '*.go' -not -path './.git/*' -not -path './bin/*')"; \
	unformatted="$$(for f in $$files; do [ -f "$$f" ] && echo "$$f"; done | xargs -r gofmt -l)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files need formatting (run gofmt -w):"; echo "$$unformatted"; exit 1; \
	fi
	@# go vet fails outright on a module with no packages yet.
	@if [ -z "$$(go list -e ./... 2>/dev/null)" ]; then \
		echo "check: no Go packages yet, skipping go vet and staticcheck"; \
	else \
		echo "go vet ./..." && go vet ./... && \
		echo "$(STATICCHECK) ./..." && $(STATICCHECK) ./...; \
	fi

# test: run check and the full test suite against the throwaway servers.
test: tools
	scripts/with-servers.sh $(MAKE) --no-print-directory test-inner

# test-inner: check + tests; run it directly with BATCHMR_TEST_* set to your own servers.
# The passes of scripts/test-passes.sh run at once: every package four at
# a time, with internal/tests/faults' timed scenarios; make check; the
# fault suite's scenarios that mostly wait (a 60 s outage among them); and
# pkg/semaphore again on the EVALSHA path. Last, the demo runs as make demo
# does (it checks its report against SQL and the queries Postgres ran at
# once against the permits), so that a change that breaks it fails here.
test-inner: $(STATICCHECK) $(STATICCHECK_STAMP)
	scripts/test-passes.sh
	scripts/demo.sh

# chaos: soak the fault suite (internal/tests/faults, which starts its own Redis
# and Postgres servers): every scenario three times, over runs of 2,500
# pages as the campaign that found the faults used. make test runs it once,
# over runs of 400 pages. with-servers.sh installs Redis and Postgres when
# they are missing.
chaos: tools
	BATCHMR_NO_BROWSER=1 scripts/with-servers.sh env BATCHMR_CHAOS_REPEAT=3 BATCHMR_CHAOS_PAGES=2500 \
		go test -race -count=1 -timeout 120m -v ./internal/tests/faults/

# bench: run the semaphore, mapreduce and paging benchmarks, the Redis
# Cluster spread and the adaptive limit against a Postgres whose CPU
# changes (internal/bench/semabench, mrbench, pagebench, clusterbench,
# adaptbench) against throwaway servers. adaptbench needs root and cgroup
# v1's CPU controller: it moves the Postgres server into a CPU group.
bench:
	BATCHMR_NO_BROWSER=1 scripts/with-servers.sh sh -c 'go run ./internal/bench/semabench && go run ./internal/bench/mrbench && go run ./internal/bench/pagebench && go run ./internal/bench/clusterbench && go run ./internal/bench/adaptbench'

# bench-adapt: run only adaptbench (about 8 minutes);
# make bench-adapt ADAPTBENCH_FLAGS=-quick is a 2-minute smoke run.
bench-adapt:
	BATCHMR_NO_BROWSER=1 scripts/with-servers.sh go run ./internal/bench/adaptbench $(ADAPTBENCH_FLAGS)

# demo: seed a table, start three workers, run orders-report with its
# progress bar, check the result against SQL and show what Postgres saw
# (scripts/demo.sh), against throwaway servers.
demo:
	BATCHMR_NO_BROWSER=1 scripts/with-servers.sh scripts/demo.sh
