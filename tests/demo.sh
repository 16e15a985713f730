#!/usr/bin/env bash
# `make demo`: starts graphd on the CPU device in a temporary directory, trains a small MLP
# through it with client/python/examples/train_mlp.py (a plain PyTorch loop with one line
# switched to graphd.make_graphed_callables), shows `graphctl status` (the example prints it while
# its session is open) and then `graphctl pools`, and stops the daemon.
#
# Environment: BUILD (build dir, default build), PYTHON (default /usr/bin/python3: Debian's
# python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
for f in "$BUILD/graphd" "$BUILD/graphctl" "$BUILD/libgraphd.so"; do
    [[ -e $f ]] || { echo "demo: no $f; run make first" >&2; exit 1; }
done

tmp=$(mktemp -d)
pid=
cleanup() {
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        wait "$pid" || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

export GRAPHD_ADDRESS="unix:$tmp/graphd.sock"
echo "== starting graphd on $GRAPHD_ADDRESS"
"$BUILD/graphd" --config /dev/null --listen "$GRAPHD_ADDRESS" >"$tmp/graphd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
    "$BUILD/graphctl" status >/dev/null 2>&1 && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "demo: graphd exited:" >&2
        cat "$tmp/graphd.log" >&2
        exit 1
    fi
    sleep 0.1
done
"$BUILD/graphctl" status >/dev/null

echo "== training client/python/examples/train_mlp.py through graphd ($PYTHON)"
GRAPHD_BUILD="$BUILD" PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" client/python/examples/train_mlp.py

echo
echo "== graphctl pools after the client left: its region is freed, the replays counted"
"$BUILD/graphctl" pools

echo
echo "== stopping graphd (SIGTERM)"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
echo "graphd exited with status $rc"
exit "$rc"
