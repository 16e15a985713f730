#!/bin/bash
# Before/after on the GPU machine: benchmarks 1 (training steps) and 2 (replay round trip) of a
# tree given as a tarball (`git archive -o before.tar <commit>`, carried in the working tree)
# against this tree, alternated round by round so that drift of the machine hits both alike.
# Each tree runs its own bench/run_gpu.sh, daemon and client. CI never runs this.
#
# Usage, on the GPU machine in the project root, with .devdeps carried:
#   bench/compare_gpu.sh BEFORE.tar OUTDIR [ROUNDS] [STEP...]
# ROUNDS defaults to 2; STEPs: build (both trees, side by side) and run (the rounds); default
# both. Environment: MPS (default 1: under NVIDIA MPS, as issue 14 asks), STEPS (training steps
# per mode, default 100). OUTDIR gets <tree>-r<N>-train.log and -replay.log per round: the
# benchmark output only (the daemons' logs stay in /tmp/compare-gpu).
set -u
tarball=${1:?usage: bench/compare_gpu.sh BEFORE.tar OUTDIR [ROUNDS] [STEP...]}
out=${2:?usage: bench/compare_gpu.sh BEFORE.tar OUTDIR [ROUNDS] [STEP...]}
rounds=${3:-2}
shift $(($# < 3 ? $# : 3))
steps=${*:-build run}
here=$PWD
work=/tmp/compare-gpu
before=$work/before-tree
mkdir -p "$out" "$work"
export MPS=${MPS:-1} STEPS=${STEPS:-100}

for step in $steps; do
    case $step in
    build)
        rm -rf "$before" && mkdir -p "$before" && tar xf "$tarball" -C "$before" || exit 1
        ln -sfn "$here/.devdeps" "$before/.devdeps"
        (cd "$before" && bench/run_gpu.sh "$work/before-build" build >"$work/before-build.txt" 2>&1) &
        bench/run_gpu.sh "$work/after-build" build >"$work/after-build.txt" 2>&1
        after_rc=$?
        wait $!
        before_rc=$?
        echo "=== build: before rc $before_rc, after rc $after_rc"
        tail -3 "$work/before-build.txt" "$work/after-build.txt"
        [ "$before_rc" = 0 ] && [ "$after_rc" = 0 ] || exit 1 ;;
    run)
        for r in $(seq "$rounds"); do
            for tree in before after; do
                dir=$here
                [ $tree = before ] && dir=$before
                (cd "$dir" && bench/run_gpu.sh "$work/$tree-r$r" train replay >/dev/null 2>&1)
                for b in train replay; do
                    cp "$work/$tree-r$r/$b.log" "$out/$tree-r$r-$b.log" 2>/dev/null ||
                        echo "missing: $tree round $r $b" >&2
                done
                echo "=== round $r, $tree: done"
            done
        done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
