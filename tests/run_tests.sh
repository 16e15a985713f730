#!/usr/bin/env bash
# Runs every graphd test: the cmocka binaries under $BUILD/tests/unit and $BUILD/tests/integration
# (each in its own process, under a timeout), then the Python tests. Called by `make test` and
# `make asan`. Counts individual test cases; the last line is "N passed, N failed[, N skipped]".
#
# Environment: BUILD (build dir, default build), PYTHON (default /usr/bin/python3), SAN (non-empty
# for sanitizer builds: Python tests are skipped), TEST_TIMEOUT (seconds per binary, default 120).
set -u
cd "$(dirname "$0")/.." || exit 2

BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
SAN=${SAN:-}
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
unset CMOCKA_MESSAGE_OUTPUT # cmocka's default: human-readable text on stdout
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

passed=0 failed=0 skipped=0
failures=()
log=$(mktemp) || exit 2
trap 'rm -f "$log"' EXIT

# Sum of the numbers in the lines of $log that match "<prefix> N <suffix>" (no match: 0).
count() {
    grep -oE "$1 [0-9]+ $2" "$log" | grep -oE '[0-9]+ ' | awk '{ s += $1 } END { print s + 0 }'
}

run_binary() {
    local bin=$1 rc p f s
    echo "=== $bin"
    timeout --kill-after=10 "$TEST_TIMEOUT" "$bin" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # cmocka prints the summary on both streams, so lines may be glued together: match anywhere.
    p=$(count '\[  PASSED  \]' 'test\(s\)')
    f=$(count '\[  FAILED  \]' 'test\(s\)')
    s=$(count '\[  SKIPPED \]' 'test\(s\)')
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if ((f > 0)); then
        failures+=("$bin ($f failed)")
    elif ((rc == 124 || rc == 137)); then
        failed=$((failed + 1)) failures+=("$bin (timed out after ${TEST_TIMEOUT}s)")
    elif ((rc > 128)); then
        failed=$((failed + 1)) failures+=("$bin (killed by signal $((rc - 128)))")
    elif ((rc != 0)); then
        failed=$((failed + 1)) failures+=("$bin (exit status $rc)")
    elif ((p + s == 0)); then
        passed=$((passed + 1)) # exited 0 without a cmocka summary: one passing test
    fi
}

for dir in "$BUILD/tests/unit" "$BUILD/tests/integration"; do
    ran=0
    for bin in "$dir"/*; do
        [[ -f $bin && -x $bin ]] || continue
        run_binary "$bin"
        ran=1
    done
    ((ran)) || echo "=== $dir: no test binaries, skipped"
done

if ! compgen -G 'tests/python/test_*.py' >/dev/null; then
    echo "=== tests/python: no Python tests"
elif [[ -n $SAN ]]; then
    echo "=== tests/python: skipped under SAN (libtorch with an ASan preload is out of scope)"
else
    echo "=== tests/python ($PYTHON -m pytest)"
    PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}" GRAPHD_BUILD=$BUILD \
        "$PYTHON" -m pytest -q tests/python 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # The summary line reads like "2 failed, 5 passed, 1 skipped, 1 error in 3.2s".
    summary=$(grep -E '[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s' "$log" | tail -n 1)
    p=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    f=$(grep -oE '[0-9]+ failed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    e=$(grep -oE '[0-9]+ errors?' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    s=$(grep -oE '[0-9]+ skipped' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
    passed=$((passed + p)) failed=$((failed + f + e)) skipped=$((skipped + s))
    if ((f + e > 0)); then
        failures+=("tests/python ($f failed, $e errors)")
    elif ((rc == 5)); then
        echo "=== tests/python: pytest collected no tests"
    elif ((rc != 0)); then
        failed=$((failed + 1)) failures+=("tests/python (pytest exit status $rc)")
    fi
fi

echo
if ((${#failures[@]} > 0)); then
    echo "Failing:"
    printf '  %s\n' "${failures[@]}"
fi
line="$passed passed, $failed failed"
((skipped > 0)) && line+=", $skipped skipped"
echo "$line"
((failed == 0))
