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

# Everything the demo writes is its own: a schema in Postgres, and a key
# prefix in Redis, which also names the job's queue (batchmr-$demo_id:JOB). Pointed at servers of your own (BATCHMR_TEST_*), it
# touches nothing else, and removes what it made.
demo_id=demo_$(date +%s)_$$
export REDIS_URL=$BATCHMR_TEST_REDIS_URL BATCHMR_PREFIX=batchmr-$demo_id
case $BATCHMR_TEST_DATABASE_URL in
*\?*) export DATABASE_URL="$BATCHMR_TEST_DATABASE_URL&search_path=$demo_id" ;;
*) export DATABASE_URL="$BATCHMR_TEST_DATABASE_URL?search_path=$demo_id" ;;
esac
psql "$BATCHMR_TEST_DATABASE_URL" -qc "CREATE SCHEMA $demo_id"

dir=$(mktemp -d)
pids=()
cleanup() {
	status=$?
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [[ $status -ne 0 ]]; then
		for log in "$dir"/worker-*.log; do
			[[ -s $log ]] && { echo "--- $log (last lines)"; tail -5 "$log"; }
		done
	fi
	psql "$BATCHMR_TEST_DATABASE_URL" -qc "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $demo_id CASCADE" || true
	redis-cli -u "$REDIS_URL" --scan --pattern "batchmr-$demo_id*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
	redis-cli -u "$REDIS_URL" --scan --pattern "asynq:{$BATCHMR_PREFIX:*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null || true
	redis-cli -u "$REDIS_URL" srem asynq:queues "$BATCHMR_PREFIX:orders-report" >/dev/null || true
	rm -rf "$dir"
	exit $status
}
trap cleanup EXIT

say "building worker, scheduler and the example"
go build -o "$dir/worker" ./cmd/worker
go build -o "$dir/scheduler" ./cmd/scheduler
go build -o "$dir/pagination" ./examples/pagination

say "seeding $rows orders"
"$dir/pagination" seed --rows "$rows"

say "setting the fleet's database permits to $permits"
"$dir/scheduler" permits set db "$permits" --new # before the workers start, as meant

say "starting $workers workers (logs in $dir/worker-N.log)"
for i in $(seq 1 "$workers"); do
	"$dir/worker" --concurrency 8 --db-permits "$permits" --poll-interval 100ms >"$dir/worker-$i.log" 2>&1 &
	pids+=($!)
done

# The workers announce their jobs; the scheduler starts only announced ones.
for _ in $(seq 1 100); do
	"$dir/scheduler" jobs --json 2>/dev/null | grep -q '"orders-report"' && break
	sleep 0.1
done
"$dir/scheduler" jobs

# Postgres's own view: how many of the workers' queries are running at once.
sampler() {
	local max=0 n
	while [[ ! -e "$dir/stop" ]]; do
		if ! n=$(psql "$BATCHMR_TEST_DATABASE_URL" -Atc "SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'batchmr-worker' AND state = 'active'" 2>"$dir/sampler.err"); then
			echo "failed" >"$dir/max-active"
			return
		fi
		((n > max)) && max=$n
		echo "$max" >"$dir/max-active"
		sleep 0.05
	done
}
sampler &
pids+=($!)

say "running orders-report (pages of $page_size orders, $slow_ms ms of pg_sleep each)"
run_out=$(timeout 300 "$dir/scheduler" run orders-report --args "{\"page_size\": $page_size, \"slow_ms\": $slow_ms}" --wait) || {
	echo "demo: the run did not succeed within 5 minutes" >&2
	exit 1
}
touch "$dir/stop"
run=$(head -1 <<<"$run_out")

say "checking the report against one SQL query"
"$dir/pagination" check "$run"

say "what Postgres saw"
sleep 0.2
max_active=$(cat "$dir/max-active")
if [[ $max_active == failed ]]; then
	echo "demo: sampling pg_stat_activity failed: $(cat "$dir/sampler.err")" >&2
	exit 1
fi
echo "most worker queries active at once (pg_stat_activity, sampled every 50 ms): $max_active"
echo "database permits:                                                          $permits"
"$dir/scheduler" permits get db
if ((max_active > permits)); then
	echo "demo: Postgres ran $max_active worker queries at once, more than the $permits permits" >&2
	exit 1
fi
