#!/usr/bin/env bash
# The test suite as passes run at once, for make test-inner: most tests
# wait on servers rather than compute, so the passes overlap well on two
# cores. Prints each background pass's output after the main pass's, and
# fails if any pass failed.
#
#   main     every package, four at a time, with internal/tests/faults'
#            timed scenarios (BATCHMR_FAULTS=timed)
#   check    make check: gofmt, go vet, staticcheck
#   waiting  internal/tests/faults' scenarios that mostly wait, side by side
#   eval     pkg/semaphore on the EVALSHA path that Redis < 7 and
#            ACL-restricted users get
set -uo pipefail

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(-race -count=1 -timeout 8m)

background() { # background NAME COMMAND...
	local name=$1
	shift
	echo "$*" >"$dir/$name.cmd"
	("$@" >"$dir/$name.log" 2>&1; echo $? >"$dir/$name.rc") &
}
background check make --no-print-directory check
background waiting env BATCHMR_FAULTS=waiting go test "${flags[@]}" ./internal/tests/faults/
background eval env BATCHMR_SEMAPHORE_SCRIPTS=eval go test "${flags[@]}" ./pkg/semaphore/

BATCHMR_FAULTS=timed go test "${flags[@]}" -p 4 ./...
status=$?
wait
for name in check waiting eval; do
	echo "$(cat "$dir/$name.cmd"):"
	cat "$dir/$name.log"
	[[ $(cat "$dir/$name.rc") == 0 ]] || status=1
done
exit "$status"
