#!/usr/bin/env bash
# script-cost.sh: what Redis spends on one call of each semaphore script
# path, in instructions, counted by callgrind on a throwaway redis-server of
# its own. Instruction counts do not move with the machine's load or speed,
# so two builds compare exactly, whatever else runs:
#
#   scripts/script-cost.sh                       # this build
#   scripts/script-cost.sh -before-exe /tmp/sb-old   # side by side with another
#
# where /tmp/sb-old is `go build -o /tmp/sb-old ./internal/bench/semabench` at
# another commit (one that has this section). Needs valgrind and
# redis-server (Debian: apt-get install valgrind redis-server). Under
# valgrind Redis runs ~50 times slower: the µs column is then not Redis's
# speed, only the instruction counts are.
set -euo pipefail
cd "$(dirname "$0")/.."
for bin in valgrind callgrind_control redis-server; do
	command -v "$bin" >/dev/null || { echo "script-cost.sh: $bin is not installed (apt-get install valgrind redis-server)" >&2; exit 1; }
done
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/valgrind.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 200); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.1
done
go build -o "$dir/semabench" ./internal/bench/semabench
"$dir/semabench" -redis "redis://127.0.0.1:$port/0" -only scripts -script-calls 500 \
	-callgrind "$dir/cg.out" -callgrind-pid "$pid" "$@"
