#!/bin/sh
# Runs every fuzz target of the module (go test -list finds them), each for
# FUZZTIME (default 30s), one at a time: both cores are the fuzzer's. A
# failure stops the run with the input Go saved under the package's
# testdata/fuzz/NAME/: fix the bug and commit that file, which make test then
# replays as a seed. Usage: scripts/fuzz.sh [FUZZTIME] (as make fuzz).
set -eu
cd "$(dirname "$0")/.."
time=${1:-${FUZZTIME:-30s}}
found=0
for pkg in $(go list ./...); do
	for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
		found=$((found + 1))
		echo "fuzz: $pkg $target for $time" >&2
		CGO_ENABLED=1 go test "$pkg" -run '^$' -fuzz "^$target\$" -fuzztime "$time" -parallel 2
	done
done
[ "$found" -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
echo "fuzz: $found targets, each for $time: nothing found" >&2
