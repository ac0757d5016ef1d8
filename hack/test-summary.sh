#!/usr/bin/env bash
# Prints, after a long `go test ./...`, what a reader of the last lines needs:
# each package's result, every failed test, and for a package that hit its
# timeout the tests that were still running. The full output stays in the
# log given as the only argument.
set -euo pipefail
log=${1:?usage: test-summary.sh LOG}
[[ -f $log ]] || exit 0
echo "== test summary (full output: $log)"
grep -E '^(ok|FAIL|---)[[:space:]]|^FAIL$|^panic: ' "$log" | grep -v -- '--- PASS' | grep -v -- '--- SKIP' || true
# A timed-out package lists the tests it was running right after the panic.
awk '/^panic: test timed out/ {p=1; n=0} p && n < 12 {print; n++} /^$/ && p {p=0}' "$log" | grep -v '^panic: test timed out' || true
# Ginkgo suites name their failed specs in a block of their own.
grep -E '^\s*\[FAIL\]' "$log" | sort -u || true
