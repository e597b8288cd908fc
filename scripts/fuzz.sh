#!/usr/bin/env bash
# fuzz.sh: runs every native Go fuzz target (func FuzzXxx in a _test.go file)
# for a short time each. FUZZTIME (default 10s) sets the time per target.
set -euo pipefail

FUZZTIME="${FUZZTIME:-10s}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

found=0
while IFS= read -r file; do
	dir="./$(dirname "$file")"
	while IFS= read -r name; do
		found=$((found + 1))
		echo "fuzz: $dir $name ($FUZZTIME)"
		go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$dir"
	done < <(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*\*testing\.F).*/\1/p' "$file")
done < <(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' --exclude-dir=.tools --exclude-dir=.git . | sed 's|^\./||' | sort)

if [ "$found" -eq 0 ]; then
	echo "fuzz: no fuzz targets found"
fi
