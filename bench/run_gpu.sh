#!/bin/bash
# Everything issue 5 measures on the GPU machine, in one go: the build against the Python torch
# (TORCH=python), the GPU tests, and the four benchmarks, each step's output in OUTDIR/<step>.log
# and on stdout. CI never runs this (it has no GPU); docs/BENCHMARKS.md records its results.
#
# Usage, on the GPU machine in the project root, with .devdeps carried (see docs/BENCHMARKS.md):
#   bench/run_gpu.sh OUTDIR [STEP...]
# Environment: PYTESTS (the pytest paths, default tests/python), STEPS (training steps per mode,
# default 200), PYTEST_LIMIT (seconds for the Python tests, default 420), SHARE_ARGS (more
# arguments for bench/share_gpu.py), PROFILE_SHAPES (default "64,512,8 256,4096,8"), PYTHON
# (default python3), DAEMON_ARGS (more graphd options for the steps that start one: train,
# replay, profile, and targets' fresh daemons, e.g. DAEMON_ARGS="--replay-spin-slice-us 0" for
# an A/B of the executor's ring watch), TARGETS (the targets step's subset of 1,2,3,4,
# default all; e.g. TARGETS=1, then TARGETS=2,3,4, where one run must stay under a time limit),
# MPS=1 (run everything under NVIDIA MPS: starts nvidia-cuda-mps-control for the run, stops it
# at the end).
# Steps (default: all, in this order): build tests train replay capture share; also profile
# (bench/step_profile.py), probe (bench/ordering_probe.py), ddp (bench/ddp_gpu.py: issue 17's
# DDP parity on one GPU), targets (bench/targets18.py: issue 18's four targets as ratios,
# about 4-6 minutes) and shareprof (bench/share_profile.py: benchmark 3's mode (c) by hardware
# queues and polling, with the executor's threads and replays sampled; SHAREPROF_ARGS adds
# arguments, e.g. "--rounds 3"). Each runs under a time limit
# (timeout(1)); a step that fails does not stop the later ones, except the build.
set -u
out=${1:?usage: bench/run_gpu.sh OUTDIR [STEP...]}
shift
steps=${*:-build tests train replay capture share}
mkdir -p "$out"
PY=${PYTHON:-$(command -v python3)}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/client/python GRAPHD_BUILD=$PWD/build

# Debian's gRPC, protobuf-c, libuv, ... unpacked from .devdeps; their headers as system headers
# (CPATH would make gcc treat them as user headers, and -Werror fail on gRPC's).
. .devdeps/device-deps env
[ -e /opt/devdeps/usr/lib/x86_64-linux-gnu/libsystemd.so.0 ] ||
    dpkg -x .devdeps/libsystemd0_*.deb /opt/devdeps
# libseccomp (the executor sandbox): device-deps does not fetch it; see docs/BENCHMARKS.md.
[ -e /opt/devdeps/usr/include/seccomp.h ] || for f in .devdeps/libseccomp*.deb; do
    [ -e "$f" ] && dpkg -x "$f" /opt/devdeps
done
export C_INCLUDE_PATH=$CPATH CPLUS_INCLUDE_PATH=$CPATH
unset CPATH

daemon_pid=
start_daemon() {
    rm -f /tmp/graphd-bench.sock /tmp/graphd-bench.sock.session
    build/graphd --config /dev/null --listen unix:/tmp/graphd-bench.sock ${DAEMON_ARGS:-} "$@" \
        >"$out/daemon-$step.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do
        [ -S /tmp/graphd-bench.sock.session ] && break
        sleep 0.1
    done
    export GRAPHD_ADDRESS=unix:/tmp/graphd-bench.sock
}
stop_daemon() {
    [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
    daemon_pid=
}
mps=
stop_all() {
    stop_daemon
    [ -n "$mps" ] && echo quit | nvidia-cuda-mps-control
}
trap stop_all EXIT
trap 'exit 143' TERM INT # so that timeout(1) still stops the daemon and MPS
if [ "${MPS:-0}" = 1 ]; then
    # Every CUDA process of the run (daemon, clients, baselines) becomes a client of one MPS
    # server, so their kernels share the GPU instead of time-slicing between contexts.
    export CUDA_MPS_PIPE_DIRECTORY=$out/mps-pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || exit 1
    mps=1
    echo "=== MPS control daemon started"
fi

run() { # step name, time limit in seconds, command...
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: rc $rc, $((SECONDS - t0)) s"
    return "$rc"
}

for step in $steps; do
    case $step in
    build)
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
        run build 300 make TORCH=python PYTHON="$PY" -j"$(nproc)" all || exit 1 ;;
    tests)
        run tests-python "${PYTEST_LIMIT:-420}" "$PY" -m pytest -q -rs ${PYTESTS:-tests/python}
        GRAPHD_PYTHON=$PY run tests-runtime 120 build/tests/unit/test_graph_runtime ;;
    train) # benchmarks 1 and 4 (steps and capture), $STEPS (200) steps per mode
        start_daemon
        run train 200 "$PY" bench/train_graphd.py --steps ${STEPS:-200} --replays 0
        stop_daemon ;;
    replay) # benchmark 2
        start_daemon
        run replay 90 "$PY" bench/train_graphd.py --shapes --replays 10000
        stop_daemon ;;
    capture) # benchmark 4, broken down (the script starts a daemon of its own)
        (
            unset GRAPHD_ADDRESS
            run capture-resident 60 "$PY" bench/capture_profile.py --device cuda:0 --repeat 3 \
                --daemon-log "$out/daemon-capture-resident.log"
            run capture-resident-large 60 "$PY" bench/capture_profile.py --device cuda:0 \
                --shape 256,4096,8 --repeat 3 --daemon-log "$out/daemon-capture-large.log"
            run capture-host 60 "$PY" bench/capture_profile.py --device cuda:0 --host-staged \
                --repeat 3 --daemon-log "$out/daemon-capture-host.log"
        ) ;;
    share) # benchmark 3: starts a daemon of its own per graphd mode
        run share 240 "$PY" bench/share_gpu.py --graphd build/graphd --json "$out/share_gpu.json" \
            ${SHARE_ARGS:-} ;;
    profile) # where benchmark 1's device-resident step spends its time
        start_daemon
        for shape in ${PROFILE_SHAPES:-64,512,8 256,4096,8}; do
            run "profile-$shape" 60 "$PY" bench/step_profile.py --shape "$shape" --steps 200
        done
        stop_daemon ;;
    targets) # issue 18's four targets as ratios (bench/targets18.py; fresh daemons of its own)
        (
            unset GRAPHD_ADDRESS
            dargs=()
            for w in ${DAEMON_ARGS:-}; do dargs+=("--daemon-arg=$w"); done
            run targets 600 "$PY" bench/targets18.py --graphd build/graphd \
                --targets "${TARGETS:-1,2,3,4}" --json "$out/targets18.json" "${dargs[@]}"
        ) ;;
    shareprof) # issue 18's profile of benchmark 3 (fresh daemons of its own)
        (
            unset GRAPHD_ADDRESS
            run shareprof 590 "$PY" bench/share_profile.py --graphd build/graphd \
                --json "$out/share_profile.json" ${SHAREPROF_ARGS:-}
        ) ;;
    probe) # ordering between two processes: IPC events, stream memory operations
        run probe 120 "$PY" bench/ordering_probe.py --iters 3000 ;;
    ddp) # issue 17: DDP parity, 2 ranks (gloo) in device-resident sessions on cuda:0
        (
            unset GRAPHD_ADDRESS # the script starts a daemon of its own
            run ddp 300 "$PY" bench/ddp_gpu.py --device cuda:0
        ) ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
