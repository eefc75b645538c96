#!/usr/bin/env bash
# The demo: a report over a Postgres table, run by three workers under a
# fleet-wide limit of database permits. Run it through `make demo`, which
# starts throwaway Redis and Postgres first (scripts/with-servers.sh).
#
# Knobs (environment): DEMO_ROWS (300000), DEMO_PAGE_SIZE (2000),
# DEMO_SLOW_MS (100: each page query sleeps this long in Postgres, so that
# the throttling is visible), DEMO_PERMITS (3), DEMO_WORKERS (3).
set -euo pipefail

rows=${DEMO_ROWS:-300000}
page_size=${DEMO_PAGE_SIZE:-2000}
slow_ms=${DEMO_SLOW_MS:-100}
permits=${DEMO_PERMITS:-3}
workers=${DEMO_WORKERS:-3}

say() { printf '\n== %s\n' "$*"; }
: "${BATCHMR_TEST_REDIS_URL:?run me through make demo (scripts/with-servers.sh sets the servers)}"
export REDIS_URL=$BATCHMR_TEST_REDIS_URL DATABASE_URL=$BATCHMR_TEST_DATABASE_URL

dir=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

say "building worker, scheduler and the example"
go build -o "$dir/worker" ./cmd/worker
go build -o "$dir/scheduler" ./cmd/scheduler
go build -o "$dir/pagination" ./examples/pagination

say "seeding $rows orders"
"$dir/pagination" seed --rows "$rows"

say "setting the fleet's database permits to $permits"
"$dir/scheduler" permits set db "$permits"

say "starting $workers workers (logs in $dir/worker-N.log)"
for i in $(seq 1 "$workers"); do
	"$dir/worker" --concurrency 8 --db-permits "$permits" >"$dir/worker-$i.log" 2>&1 &
	pids+=($!)
done

# Postgres's own view: how many of the workers' queries are running at once.
sampler() {
	local max=0 n
	while [[ ! -e "$dir/stop" ]]; do
		n=$(psql "$DATABASE_URL" -Atc "SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'batchmr-worker' AND state = 'active'" 2>/dev/null || echo 0)
		((n > max)) && max=$n
		echo "$max" >"$dir/max-active"
		sleep 0.05
	done
}
sampler &
pids+=($!)

say "running orders-report (pages of $page_size orders, $slow_ms ms of pg_sleep each)"
run_out=$("$dir/scheduler" run orders-report --args "{\"page_size\": $page_size, \"slow_ms\": $slow_ms}" --wait) || {
	echo "demo: the run did not succeed" >&2
	exit 1
}
touch "$dir/stop"
run=$(head -1 <<<"$run_out")

say "checking the report against one SQL query"
"$dir/pagination" check "$run"

say "what Postgres saw"
sleep 0.2
echo "most worker queries active at once (pg_stat_activity, sampled every 50 ms): $(cat "$dir/max-active")"
echo "database permits:                                                          $permits"
"$dir/scheduler" permits get db
