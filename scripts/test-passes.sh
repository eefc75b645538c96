#!/usr/bin/env bash
# The test suite as four passes run at once, for make test-inner: most
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
# The fault suite's timed scenarios are the longest pass: they start first,
# rather than waiting for a slot among the other packages.
faults=./internal/tests/faults/
pass timed BATCHMR_FAULTS=timed "$faults"
pass waiting BATCHMR_FAULTS=waiting "$faults"
pass eval BATCHMR_SEMAPHORE_SCRIPTS=eval ./pkg/semaphore/

go test "${flags[@]}" -p 4 $(go list ./... | grep -v '/internal/tests/faults$')
status=$?
wait
for name in timed waiting eval; do
	case $name in
	timed) echo "BATCHMR_FAULTS=timed go test -race $faults:" ;;
	waiting) echo "BATCHMR_FAULTS=waiting go test -race $faults:" ;;
	eval) echo "BATCHMR_SEMAPHORE_SCRIPTS=eval go test -race ./pkg/semaphore/:" ;;
	esac
	cat "$dir/$name.log"
done
for rc in "$dir"/*.rc; do
	[[ $(cat "$rc") == 0 ]] || status=1
done
exit "$status"
