#!/usr/bin/env bash
# `make bench`: runs the CPU replay benchmark (bench/replay_cpu.c) against a daemon it starts
# itself from $BUILD, or against $GRAPHD_ADDRESS when set. Arguments go to replay_cpu
# (--iters N, --warmup N). A benchmark, not a test: it prints a table and does not judge.
#
# Environment: BUILD (build dir, default build), PYTHON (the python with torch that traces the
# module, default /usr/bin/python3; GRAPHD_PYTHON overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
for f in "$BUILD/graphd" "$BUILD/bench/replay_cpu"; do
    [[ -x $f ]] || { echo "bench: no $f; run make first" >&2; exit 1; }
done

echo "== bench/replay_cpu ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs)"
GRAPHD_PYTHON=${GRAPHD_PYTHON:-$PYTHON} "$BUILD/bench/replay_cpu" "$@"
