#!/usr/bin/env bash
# The test suite as three passes run at once, for make test-inner: most
# tests wait on servers rather than compute, so the passes overlap well on
# two cores. Prints each background pass's output after the main pass's, and
# fails if any pass failed.
set -uo pipefail

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(-race -count=1 -timeout 8m)

pass() { # pass NAME ENV-ASSIGNMENT PACKAGE...
	local name=$1 env=$2
	shift 2
	(env "$env" go test "${flags[@]}" "$@" >"$dir/$name.log" 2>&1; echo $? >"$dir/$name.rc") &
}
pass waiting BATCHMR_FAULTS=waiting ./internal/tests/faults/
pass eval BATCHMR_SEMAPHORE_SCRIPTS=eval ./pkg/semaphore/

BATCHMR_FAULTS=timed go test "${flags[@]}" -p 4 ./...
status=$?
wait
echo "BATCHMR_FAULTS=waiting go test -race ./internal/tests/faults/:"
cat "$dir/waiting.log"
echo "BATCHMR_SEMAPHORE_SCRIPTS=eval go test -race ./pkg/semaphore/:"
cat "$dir/eval.log"
for rc in "$dir"/*.rc; do
	[[ $(cat "$rc") == 0 ]] || status=1
done
exit "$status"
