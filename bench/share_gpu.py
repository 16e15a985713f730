#!/usr/bin/env python3
"""Sharing one GPU among N training processes (issue 5, benchmark 3).

N processes (--procs, default 8) each train the same MLP (--batch, --width, --depth; default
(64, 512, 8): Linear layers with ReLU between them, MSE loss, torch.optim.SGD lr 1e-3, fp32, the
step of bench/train_graphd.py: zero_grad, forward, loss, backward, opt.step), all at the same
time on one GPU, in three modes:

  (a) in-process: each process captures its own CUDA graphs with
      torch.cuda.make_graphed_callables (CUDA model, its own CUDA context and caching allocator).
  (b) graphd host-staged: CPU model and CPU tensors, graphd.make_graphed_callables(model, (x,),
      device="cuda:0", pool=P), P one named pool on cuda:0 that the parent creates in a fresh
      daemon and every process joins by name (graphd.graph_pool_handle(name, device="cuda:0")).
      The clients never open a CUDA context; the daemon's is the only one.
  (c) graphd device-resident: CUDA model, graphd.make_graphed_callables(model, (x,), pool=P),
      P again one shared pool on cuda:0 (the client API takes a named cuda:0 pool for
      device-resident captures too): the static tensors are the daemon's device memory, mapped
      into each process with CUDA IPC. Each client still has its own CUDA context.
  (d) graphd device-resident with a pool per process (pool=None: each capture its own pool).
      Since the daemon gives each session of a pool its own graph mempool and stream, (c) and
      (d) should now perform alike; (d) is kept to show it (an earlier daemon shared one
      mempool and one stream among a pool's sessions, which serialised (c)).

What is measured, per mode:

* Aggregate steps/s: every worker captures, runs --warmup steps, synchronises and reports
  "ready"; once all N are ready the parent releases them together (one "go" line on each
  worker's stdin; the parent's CLOCK_MONOTONIC reading just before is the window's start). Each
  worker runs --steps steps (or until --seconds after the release), synchronises its device, and
  reports its step count and its CLOCK_MONOTONIC start and end (the clock is system-wide, so the
  parent's and the workers' readings compare). Aggregate steps/s = the sum of the workers' steps /
  (the last worker's end - the release). Mean step ms = the mean over workers of their own
  elapsed / steps.
* --interleave R (steps/s only, no memory): every mode's N workers are started, captured and
  warmed up first (each graphd mode with its own daemon), then R rounds of one timed window per
  mode, the modes' order reversed every other round, while the other modes' workers wait idle.
  A round's windows are seconds apart, so a host whose speed drifts over minutes moves both
  figures of its ratio alike; each round prints its ratio to (a).
* GPU memory: a parent thread samples the whole device's used memory (nvidia-smi
  --query-gpu=memory.used) and the per-process use (--query-compute-apps) every
  --sample-interval seconds. The figure is the peak of the device-wide number between "all
  ready" and "all done" (every worker keeps its memory until the parent tells it to exit, after
  the last one is done) minus a baseline taken just before the mode starts: before its workers,
  and for (b) and (c) before the fresh daemon the mode starts, so the daemon's context, its
  pools and its graphs count against graphd. The parent itself never opens a CUDA context (it
  does not even import torch). Without nvidia-smi, a helper subprocess reads
  torch.cuda.mem_get_info() device-wide on request; it holds a CUDA context of its own for the
  whole run, before every baseline, so that context cancels out of each difference. The source
  used is printed. With --address (an existing daemon) the daemon is already running at the
  baseline, so its idle memory is NOT counted: use that only for trying things out.
* Fairness: every worker gets --threads intra-op CPU threads (default: the CPUs available /
  N), so that the host-staged clients, whose loss, backward glue and optimizer run on the CPU,
  share the host rather than oversubscribing it 8 times over. The daemon runs with its
  defaults (one device worker serves every session of the device).
* A cross-check, not a speed figure: every process starts from the same model (seed 0) with its
  own data (seed 1000 + rank), so with --steps each rank's final loss must agree across modes;
  the largest relative difference is printed.

Without a GPU (--device cpu, or automatically when torch has no CUDA) the same orchestration
runs with CPU substitutes, as a smoke test: (a) eager CPU training in-process, (b) and (c) graphd
on its cpu:0 device with one shared cpu:0 pool (the same path for both; there is no
host-staged/device-resident distinction on the CPU); memory is "n/a".

Usage (GPU machine, repository root; build/graphd built with `make TORCH=python PYTHON=python3`):
  PYTHONPATH=client/python python3 bench/share_gpu.py [--procs 8] [--steps 200] [--json out.json]
(the default 200 steps make a short window, under a second for (a) on an H200, docs/BENCHMARKS.md,
"One-off probes"; --seconds 10 gives a
longer, steadier one, but then the final losses are not comparable across modes)
Smoke test without a GPU:
  PYTHONPATH=client/python /usr/bin/python3 bench/share_gpu.py --device cpu --procs 2 --steps 20

Workers are this script run again (--worker MODE); each one, and each daemon, is in its own
session (a terminal's Ctrl-C reaches only the parent, which stops them in order) and gets SIGTERM
if the parent dies (PR_SET_PDEATHSIG).
"""
import argparse
import ctypes
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from bench_models import PHASES  # bench/, the script's own folder (imports no torch)

REPO = Path(__file__).resolve().parents[1]
TAG = "share_gpu:"  # prefix of the workers' report lines on stdout; anything else is noise
NVIDIA_SMI_FALLBACK = "/usr/local/nvidia/bin/nvidia-smi"

MODES = {
    "a": ("in-process torch.cuda.make_graphed_callables", "in-process eager (CPU)"),
    "b": ("graphd host-staged, one shared pool", "graphd cpu:0, one shared pool"),
    "c": ("graphd device-resident, one shared pool", "graphd cpu:0, one shared pool (= b on CPU)"),
    # A pool per process; the same as (c) now that each session of a pool has a mempool and a
    # stream of its own (an earlier daemon serialised a shared pool's sessions on one stream).
    "d": ("graphd device-resident, a pool per process", "graphd cpu:0, a pool per process"),
}
TARGET_MEM_B_OVER_A = 0.3     # (b) GPU memory / (a) GPU memory <= 0.3
TARGET_STEPS_C_OVER_A = 1.0   # (c) aggregate steps/s / (a) aggregate steps/s >= 1.0


def now():
    """CLOCK_MONOTONIC, explicitly: the one clock the parent and the workers share."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def emit(**msg):
    print(TAG + " " + json.dumps(msg), flush=True)


# ---------------------------------------------------------------------------------------------
# Worker: one training process.

def worker(a):
    import torch
    import torch.nn as nn

    from bench_models import mlp, timed_step  # bench/, the script's own folder

    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    on_gpu = cuda and a.worker in ("a", "c", "d")  # (b)'s clients never touch CUDA
    dev = "cuda:0" if on_gpu else "cpu"

    torch.manual_seed(0)  # the same initial model in every process, as N copies of one job
    model = mlp(a.width, a.depth).to(dev)
    gen = torch.Generator().manual_seed(1000 + a.rank)  # its own data per process
    x = torch.randn(a.batch, a.width, generator=gen).to(dev)
    y = torch.randn(a.batch, a.width, generator=gen).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)

    t0 = now()
    session = None
    if a.worker == "a":
        g = torch.cuda.make_graphed_callables(model, (x.clone(),)) if cuda else model
    else:
        import graphd
        pool = graphd.graph_pool_handle(a.pool, device=a.pool_device) if a.pool else None
        kw = {"device": "cuda:0"} if (cuda and a.worker == "b") else {}
        g = graphd.make_graphed_callables(model, (x.clone(),), pool=pool, **kw)
        session = graphd.default_client().session_id
    sync()
    capture_ms = (now() - t0) * 1e3

    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(g(x), y)
        loss.backward()
        opt.step()
        return loss

    phase_ns = [0] * len(PHASES)

    def step_timed():  # --phases: the same step, each phase's host time summed
        return timed_step(g, opt, x, y, phase_ns)

    for _ in range(a.warmup):
        step()
    sync()
    emit(event="ready", rank=a.rank, pid=os.getpid(), capture_ms=capture_ms, session=session,
         cuda_context=torch.cuda.is_initialized())  # (is_available() would itself init CUDA)

    if a.phases:
        step = step_timed
    # The barrier: "go <release time> <deadline or 0>" for each timed window (one, or one per
    # round with --interleave), then "exit". Between windows and after the last, this process
    # keeps its memory, so the parent's samples between "all ready" and "all done" always see
    # all N processes.
    while True:
        words = sys.stdin.readline().split()
        if not words or words[0] != "go":
            return 0 if words[:1] == ["exit"] else 1  # EOF: the parent went away
        deadline = float(words[2])
        steps = 0
        t_start = now()
        if deadline > 0:
            while now() < deadline:
                loss = step()
                steps += 1
        else:
            for _ in range(a.steps):
                loss = step()
                steps += 1
        sync()  # the steps are done on the device, not just queued
        t_end = now()
        last = float(loss.item()) if steps else float("nan")
        emit(event="done", rank=a.rank, steps=steps, t_start=t_start, t_end=t_end,
             elapsed=t_end - t_start, loss=last,
             phase_us=[ns / 1e3 / max(steps, 1) for ns in phase_ns] if a.phases else None)
        phase_ns[:] = [0] * len(PHASES)


# ---------------------------------------------------------------------------------------------
# Parent: processes, daemon, memory sampling.

class ModeFailed(Exception):
    pass


_libc = None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl  # resolved here, not in the forked child
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent():
    """preexec_fn: SIGTERM when the parent goes (even by SIGKILL), so nothing outlives it."""
    if _prctl is not None:
        _prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


def spawn(cmd, **kw):
    # Own session: a terminal's Ctrl-C goes to the parent only, which then stops the children
    # in order (workers first, then the daemon with SIGTERM so it drains and exits cleanly).
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent, **kw)


def stop(proc, sig=signal.SIGTERM, grace=10.0):
    """Stops one child we started (by its pid only); its exit code."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def tail(path, n=25):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-n:])


def find_nvidia_smi():
    return shutil.which("nvidia-smi") or (
        NVIDIA_SMI_FALLBACK if os.access(NVIDIA_SMI_FALLBACK, os.X_OK) else None)


class MemReader:
    """Device-wide used GPU memory (MiB) and, with nvidia-smi, the use of each process on it."""

    def __init__(self, python):
        self.lock = threading.Lock()
        self.helper = None
        self.smi = find_nvidia_smi()
        # cuda:0 of the workers is the first visible device: name it to nvidia-smi the same way
        # (an index or a UUID are both accepted by -i).
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        self.gpu = vis or "0"
        if self.smi:
            self.uuid = self._smi("--query-gpu=uuid")[0].strip()
            self.source = "nvidia-smi (%s -i %s)" % (self.smi, self.gpu)
        else:
            # A helper that keeps one CUDA context for the whole run: it is there at every
            # baseline, so it cancels out of every difference.
            code = ("import sys, torch\n"
                    "torch.cuda.init()\n"
                    "for _ in sys.stdin:\n"
                    "    free, total = torch.cuda.mem_get_info(0)\n"
                    "    print((total - free) / 1048576.0, flush=True)\n")
            self.helper = spawn([python, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
            self.source = ("torch.cuda.mem_get_info in a helper process (no nvidia-smi; the "
                           "helper's own context cancels out of each difference)")

    def _smi(self, query):
        out = subprocess.run([self.smi, "-i", self.gpu, query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return [line for line in out.splitlines() if line.strip()]

    def read(self):
        """(used MiB device-wide, {pid: MiB} or None)."""
        with self.lock:
            if self.helper is not None:
                self.helper.stdin.write("\n")
                self.helper.stdin.flush()
                return float(self.helper.stdout.readline()), None
            used = float(self._smi("--query-gpu=memory.used")[0])
            apps = {}
            # --query-compute-apps ignores -i on some drivers: filter on the GPU's UUID.
            out = subprocess.run([self.smi, "--query-compute-apps=gpu_uuid,pid,used_memory",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=30).stdout
            for line in out.splitlines():
                f = [s.strip() for s in line.split(",")]
                if len(f) == 3 and f[0] == self.uuid and f[1].isdigit():
                    try:
                        apps[int(f[1])] = apps.get(int(f[1]), 0.0) + float(f[2])
                    except ValueError:  # "[N/A]" in some containers
                        pass
            return used, apps

    def settled(self, floor, timeout=30.0, slack=64.0):
        """Waits (up to timeout) for the device to come back near floor MiB after a mode; the
        median of three readings then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.read()[0] > floor + slack:
            time.sleep(0.5)
        return statistics.median(self.read()[0] for _ in range(3))

    def close(self):
        if self.helper is not None:
            stop(self.helper, grace=5)


class Sampler(threading.Thread):
    """Reads the device every interval seconds into self.samples: (time, MiB, {pid: MiB})."""

    def __init__(self, reader, interval):
        super().__init__(daemon=True)
        self.reader, self.interval = reader, interval
        self.samples = []
        self.error = None
        self.halt = threading.Event()

    def sample(self):
        used, apps = self.reader.read()
        self.samples.append((now(), used, apps))

    def run(self):
        while not self.halt.is_set():
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001 (reported with the result, not fatal here)
                self.error = repr(e)
            self.halt.wait(self.interval)

    def finish(self):
        self.halt.set()
        self.join(timeout=60)


class Daemon:
    """A fresh graphd for one mode, on a socket in the run's temporary directory."""

    def __init__(self, exe, tmp, tag, extra=()):
        self.log = tmp / ("graphd-%s.log" % tag)
        self.address = "unix:%s" % (tmp / ("graphd-%s.sock" % tag))
        with open(self.log, "w") as out:
            self.proc = spawn([str(exe), "--config", "/dev/null", "--listen", self.address,
                               "--log-level", "warn"] + list(extra), stdout=out,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        from gd_daemon import wait_until_answering  # bench/, the script's own folder
        why = wait_until_answering(self.proc, self.address)
        if why is not None:
            raise ModeFailed("%s:\n%s" % (why, tail(self.log)))

    def stop(self):
        rc = stop(self.proc, grace=20)
        return rc


class Workers:
    """N worker processes of one mode and the thread that reads each one's stdout."""

    def __init__(self):
        self.procs = []
        self.logs = []
        self.q = queue.Queue()

    def start(self, cmd, env, log):
        rank = len(self.procs)
        self.logs.append(log)
        with open(log, "w") as err:
            p = spawn(cmd + ["--rank", str(rank)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=err, text=True, env=env)
        self.procs.append(p)
        threading.Thread(target=self._read, args=(rank, p), daemon=True).start()

    def _read(self, rank, p):
        for line in p.stdout:
            if line.startswith(TAG):
                self.q.put((rank, json.loads(line[len(TAG):])))
            else:
                sys.stderr.write("[worker %d] %s" % (rank, line))
        self.q.put((rank, None))  # EOF: it exited

    def collect(self, event, timeout):
        """{rank: message} once every worker has sent event; ModeFailed when one exits first."""
        got = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(len(self.procs))) - set(got))
                raise ModeFailed("no %r from workers %s within %d s" % (event, missing, timeout))
            try:
                rank, msg = self.q.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg is None:
                rc = self.procs[rank].wait()
                raise ModeFailed("worker %d exited (status %s) before %r; its stderr:\n%s" % (
                    rank, rc, event, tail(self.logs[rank])))
            if msg.get("event") == event:
                got[rank] = msg
        return got

    def tell(self, text):
        for rank, p in enumerate(self.procs):
            try:
                p.stdin.write(text)
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                raise ModeFailed("worker %d is gone:\n%s" % (rank, tail(self.logs[rank])))

    def finish(self, timeout=60):
        """Lets them exit (after "exit"); their exit codes."""
        deadline = time.monotonic() + timeout
        rcs = []
        for p in self.procs:
            try:
                rcs.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                rcs.append(stop(p, grace=5))
        return rcs

    def kill(self):
        for p in self.procs:
            stop(p, grace=5)


class ModeRun:
    """One mode's fresh daemon (graphd modes), shared pool and N workers, captured and warmed up
    (start), then one timed window or more (window), then its end (close)."""

    def __init__(self, mode, a, tmp):
        self.mode, self.a, self.tmp = mode, a, tmp
        self.res = {"mode": mode, "label": MODES[mode][0 if a.device == "cuda" else 1]}
        self.graphd_mode = mode in ("b", "c", "d")
        self.daemon = self.client = self.pool_name = None
        self.workers = Workers()

    def start(self, before_workers=None):
        """Starts everything the mode needs and waits until each worker reports ready; returns
        their ready messages. before_workers() runs just before the workers start."""
        a, mode, res = self.a, self.mode, self.res
        cuda = a.device == "cuda"
        if self.graphd_mode:
            import graphd
            if a.address:
                address = a.address
            else:
                self.daemon = Daemon(a.graphd, self.tmp, mode, a.daemon_arg)
                address = self.daemon.address
            self.client = graphd.Client(address)
            pool_dev = "cuda:0" if cuda else "cpu:0"
            if pool_dev not in [d["id"] for d in self.client.devices()]:
                raise ModeFailed("graphd at %s has no %s device (for CUDA, build it with "
                                 "`make TORCH=python PYTHON=python3`)" % (address, pool_dev))
            if mode != "d":
                # One pool for all N processes, made here; each worker joins it by name.
                self.pool_name = "share-gpu-%d-%s" % (os.getpid(), mode)
                self.client.create_pool(self.pool_name, pool_dev)
            res.update(address=address, pool=self.pool_name, pool_device=pool_dev,
                       daemon_pid=self.client.status()["daemon"].get("pid"))  # attribution
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        if self.graphd_mode:
            env["GRAPHD_ADDRESS"] = address
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode,
               "--device", a.device, "--batch", str(a.batch), "--width", str(a.width),
               "--depth", str(a.depth), "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--threads", str(a.threads)] + (["--phases"] if a.phases else [])
        if self.pool_name:
            cmd += ["--pool", self.pool_name, "--pool-device", pool_dev]
        if before_workers is not None:
            before_workers()
        for i in range(a.procs):
            self.workers.start(cmd, env, self.tmp / ("worker-%s-%d.log" % (mode, i)))
        ready = self.workers.collect("ready", a.timeout)
        res["capture_ms_mean"] = statistics.mean(r["capture_ms"] for r in ready.values())
        return ready

    def pool_status(self):
        pool = next((p for p in self.client.status()["pools"] if p["name"] == self.pool_name), {})
        return {k: pool.get(k) for k in ("sessions", "graphs", "regions", "used_bytes",
                                         "reserved_bytes")}

    def window(self):
        """One timed window: every worker released at once; (their done messages, the figures)."""
        a = self.a
        t_go = now()
        self.workers.tell("go %.9f %.9f\n" % (t_go, t_go + a.seconds if a.seconds else 0.0))
        done = self.workers.collect("done", a.timeout)
        steps = sum(d["steps"] for d in done.values())
        window = max(d["t_end"] for d in done.values()) - t_go
        return done, dict(
            steps=steps, window_s=window, steps_per_s=steps / window,
            step_ms_mean=statistics.mean(d["elapsed"] / max(d["steps"], 1) * 1e3
                                         for d in done.values()),
            start_skew_ms=(max(d["t_start"] for d in done.values()) - t_go) * 1e3)

    def finish(self):
        """Lets the workers exit; a warning in the results where one failed."""
        self.workers.tell("exit\n")
        rcs = self.workers.finish()
        if any(rcs):
            self.res["warning"] = "worker exit codes %s" % rcs

    def close(self):
        a, res = self.a, self.res
        self.workers.kill()
        if self.client is not None:
            if a.address and self.pool_name:  # an existing daemon: leave it as we found it
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    try:
                        self.client.delete_pool(self.pool_name)
                        break
                    except Exception:  # noqa: BLE001 (sessions still closing; best effort)
                        time.sleep(0.2)
            self.client.close()
        if self.daemon is not None:
            rc = self.daemon.stop()
            if rc:
                res["warning"] = (res.get("warning", "") + " graphd exit status %s:\n%s" % (
                    rc, tail(self.daemon.log))).strip()


def run_mode(mode, a, tmp, reader, floor):
    run = ModeRun(mode, a, tmp)
    res = run.res
    sampler = None

    def start_sampler():
        nonlocal sampler
        if reader is not None:
            sampler = Sampler(reader, a.sample_interval)
            sampler.start()

    try:
        if reader is not None:
            res["baseline_mib"] = reader.settled(floor)
        ready = run.start(start_sampler)
        t_ready = now()
        if sampler is not None:
            try:
                sampler.sample()  # at least one reading with all N captured and warmed up
            except Exception as e:  # noqa: BLE001 (the thread's readings may still do)
                sampler.error = repr(e)
        if run.graphd_mode:
            res["pool_status"] = run.pool_status()
        done, figures = run.window()
        t_done = now()
        run.finish()
        res.update(figures)
        res["workers"] = [dict(ready[i], **{k: done[i][k] for k in ("steps", "elapsed", "loss",
                                                                    "t_start", "t_end",
                                                                    "phase_us")})
                          for i in range(a.procs)]
        if a.phases:
            res["phase_us_mean"] = [statistics.mean(d["phase_us"][k] for d in done.values())
                                    for k in range(len(PHASES))]
        win = []
        if sampler is not None:
            sampler.finish()
            win = [s for s in sampler.samples if t_ready <= s[0] <= t_done]
            if sampler.error:
                res["mem_sampler_error"] = sampler.error
        if win:
            _, used, apps = max(win, key=lambda s: s[1])
            res.update(mem_mib=used - res["baseline_mib"], mem_peak_device_mib=used,
                       mem_samples=len(win), mem_source=reader.source)
            if apps is not None:  # who held what at the peak
                wpids = {w["pid"] for w in res["workers"]}
                dpid = res.get("daemon_pid")
                seen = set().union(*(set(s[2]) for s in win))
                res["mem_at_peak"] = {
                    "daemon_mib": apps.get(dpid) if dpid else None,
                    "workers_mib": sum(v for p, v in apps.items() if p in wpids),
                    "other_mib": sum(v for p, v in apps.items() if p not in wpids and p != dpid),
                    "workers_with_gpu_memory": len(wpids & seen),
                    "processes_listed": len(apps)}
        return res
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.finish()
        run.close()


def run_interleaved(a, tmp):
    """--interleave R: every mode's N workers started, captured and warmed up first (each mode
    with its own daemon), then R rounds of one timed window per mode, the modes' order reversed
    every other round, while the other modes' workers wait idle (blocked on their stdin). The
    modes' windows of one round are seconds apart, so a host whose speed drifts over a run
    (docs/BENCHMARKS.md) moves both figures of a ratio alike. Returns (the rounds, each mode's
    result)."""
    runs = [ModeRun(m, a, tmp) for m in a.modes]
    rounds = []
    try:
        for run in runs:
            print("share_gpu: starting mode (%s) ..." % run.mode, file=sys.stderr, flush=True)
            run.start()
        for r in range(a.interleave):
            order = runs if r % 2 == 0 else runs[::-1]
            row = {"round": r + 1, "order": [run.mode for run in order]}
            for run in order:
                row[run.mode] = run.window()[1]
            rounds.append(row)
        for run in runs:
            run.finish()
    finally:
        for run in runs:
            run.close()
    return rounds, [run.res for run in runs]


def failure(e, mode, label):
    """A mode's (or the interleaved run's) result when it failed: what, and for an unexpected
    exception also where, in the JSON too."""
    r = {"mode": mode, "label": label, "error": str(e)}
    if not isinstance(e, ModeFailed):
        r["error"] = "%s: %s" % (type(e).__name__, e)
        r["traceback"] = traceback.format_exc()
    return r


def report_interleaved(a, rounds, results):
    print("share_gpu: %d processes per mode, MLP (batch %d, width %d, depth %d), %d interleaved "
          "rounds of one %g s window per mode, %d CPU threads each" % (
              a.procs, a.batch, a.width, a.depth, a.interleave, a.seconds, a.threads))
    for res in results:
        if "error" in res:
            print("(%s) %s FAILED: %s" % (res["mode"], res["label"], res["error"]))
            continue
        print("(%s) %s: capture %.1f ms (mean)%s" % (res["mode"], res["label"],
                                                     res["capture_ms_mean"],
                                                     "; " + res["warning"] if "warning" in res
                                                     else ""))
    ref = "a" if "a" in a.modes else a.modes[0]  # in-process, what the ratios are against
    for row in rounds:
        print("round %d (%s): %s" % (row["round"], ",".join(row["order"]), "; ".join(
            "(%s) %.0f steps/s, %.3f ms a step" % (m, row[m]["steps_per_s"],
                                                   row[m]["step_ms_mean"])
            for m in a.modes)) + "".join(
            "; (%s)/(%s) %.3f" % (m, ref, row[m]["steps_per_s"] / row[ref]["steps_per_s"])
            for m in a.modes if m != ref))


def environment(a, python):
    """What the results depend on, gathered without opening a CUDA context in this process."""
    code = ("import json, torch\n"
            "d = {'torch': torch.__version__, 'cuda_available': torch.cuda.is_available()}\n"
            "if d['cuda_available']:\n"
            "    p = torch.cuda.get_device_properties(0)\n"
            "    d.update(gpu=p.name, gpu_mib=p.total_memory >> 20, cuda=torch.version.cuda,\n"
            "             capability='%d.%d' % (p.major, p.minor))\n"
            "print(json.dumps(d))\n")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        sys.exit("share_gpu: %s cannot import torch:\n%s" % (python, out.stderr))
    env = json.loads(out.stdout.strip().splitlines()[-1])
    env.update(python=platform.python_version(), host_cpus=len(os.sched_getaffinity(0)),
               date_utc=time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()))
    smi = find_nvidia_smi()
    if smi:
        r = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        env["driver"] = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout else None
    if a.graphd.exists():
        r = subprocess.run([str(a.graphd), "--version"], capture_output=True, text=True)
        env["graphd"] = r.stdout.strip()
    return env


def report(a, env, results, mem_source):
    cuda = a.device == "cuda"
    print("share_gpu: %d processes, MLP (batch %d, width %d, depth %d), fp32, SGD lr 1e-3, %s "
          "after %d warm-up steps, %d CPU threads each" % (
              a.procs, a.batch, a.width, a.depth,
              ("%g s" % a.seconds) if a.seconds else ("%d timed steps each" % a.steps),
              a.warmup, a.threads))
    if cuda:
        print("torch %s (CUDA %s), %s (cuda:0, %s MiB, sm %s), driver %s, %s, python %s, "
              "%d CPUs, %s" % (env["torch"], env.get("cuda"), env.get("gpu"), env.get("gpu_mib"),
                               env.get("capability"), env.get("driver"), env.get("graphd"),
                               env["python"], env["host_cpus"], env["date_utc"]))
        print("GPU memory: %s; peak device-wide used memory while all workers were captured "
              "and running, minus the baseline before the mode%s" % (
                  mem_source, " (existing daemon: its idle memory is NOT counted)"
                  if a.address else " (graphd modes: before their fresh daemon)"))
    else:
        print("torch %s, CPU substitutes (no GPU): %s, python %s, %d CPUs, %s" % (
            env["torch"], env.get("graphd"), env["python"], env["host_cpus"], env["date_utc"]))
    print()
    hdr = "%-48s %12s %14s %12s %12s" % ("mode", "agg steps/s", "step ms/proc", "GPU MiB",
                                         "capture ms")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        name = "(%s) %s" % (r["mode"], r["label"])
        if "error" in r:
            print("%-48s FAILED: %s" % (name, r["error"].splitlines()[0]))
            continue
        mem = "%.0f" % r["mem_mib"] if "mem_mib" in r else "n/a"
        print("%-48s %12.1f %14.3f %12s %12.1f" % (name, r["steps_per_s"], r["step_ms_mean"],
                                                   mem, r["capture_ms_mean"]))
    print()
    for r in results:
        if "error" in r:
            print("(%s) error:\n%s" % (r["mode"], r["error"]))
            continue
        bits = ["%d steps in a %.3f s window (last start %.1f ms after release)" % (
            r["steps"], r["window_s"], r["start_skew_ms"])]
        if "pool_status" in r:
            ps = r["pool_status"]
            bits.append("pool %s: %s sessions, %s graphs, %s regions, %.1f MiB used" % (
                r["pool"], ps.get("sessions"), ps.get("graphs"), ps.get("regions"),
                int(ps.get("used_bytes") or 0) / 1048576.0))
        if a.device == "cuda":
            bits.append("%d of %d workers opened a CUDA context (their own report)" % (
                sum(1 for w in r["workers"] if w.get("cuda_context")), a.procs))
        if "mem_at_peak" in r:
            m = r["mem_at_peak"]
            bits.append("at the peak (%.0f MiB device-wide, baseline %.0f): daemon %s MiB, "
                        "workers %.0f MiB, other %.0f MiB; %d of %d workers held GPU memory" % (
                            r["mem_peak_device_mib"], r["baseline_mib"],
                            "%.0f" % m["daemon_mib"] if m["daemon_mib"] is not None else "-",
                            m["workers_mib"], m["other_mib"], m["workers_with_gpu_memory"],
                            a.procs))
            if m["processes_listed"] == 0:
                bits.append("nvidia-smi listed no processes (PID namespace?): no attribution")
        if "phase_us_mean" in r:
            bits.append("host us per step, mean of the workers: " + ", ".join(
                "%s %.1f" % (n, v) for n, v in zip(PHASES, r["phase_us_mean"])))
        for key in ("warning", "mem_sampler_error"):
            if key in r:
                bits.append("%s: %s" % (key, r[key]))
        print("(%s) " % r["mode"] + "\n    ".join(bits))

    # Same seeds and step counts in every mode: each rank's final loss should agree across modes
    # (a cheap check that the graphd modes trained the same model, not just ran fast).
    ok = [r for r in results if "error" not in r]
    if len(ok) > 1 and not a.seconds:
        worst = max(abs(r["workers"][i]["loss"] - ok[0]["workers"][i]["loss"]) /
                    max(abs(ok[0]["workers"][i]["loss"]), 1e-12)
                    for r in ok[1:] for i in range(a.procs))
        print("final loss per process, modes %s against (%s): max relative difference %.2e" % (
            ",".join(r["mode"] for r in ok[1:]), ok[0]["mode"], worst))
    ratios = ratio_figures(results, judge=cuda)
    print()
    for name, value, target, met in ratios:
        print("%-34s %8s   target %s   %s" % (
            name, "n/a" if value is None else "%.3f" % value, target,
            ("met" if met else "MISSED") if met is not None else
            ("" if cuda else "(CPU substitutes: not judged)")))
    return ratios


def ratio_figures(results, judge=True):
    """[(name, value, target, met)]; met is None when a figure is missing or not judged (the CPU
    substitutes say nothing about the GPU targets)."""
    by = {r["mode"]: r for r in results if "error" not in r}
    out = []
    a, b, c = by.get("a"), by.get("b"), by.get("c")
    v = (b["mem_mib"] / a["mem_mib"] if a and b and "mem_mib" in a and "mem_mib" in b
         and a["mem_mib"] > 0 else None)
    out.append(("(b) GPU memory / (a) GPU memory", v, "<= %.1f" % TARGET_MEM_B_OVER_A,
                None if v is None or not judge else v <= TARGET_MEM_B_OVER_A))
    v = c["steps_per_s"] / a["steps_per_s"] if a and c else None
    out.append(("(c) steps/s / (a) steps/s", v, ">= %.1f" % TARGET_STEPS_C_OVER_A,
                None if v is None or not judge else v >= TARGET_STEPS_C_OVER_A))
    d = by.get("d")
    v = d["steps_per_s"] / a["steps_per_s"] if a and d else None
    out.append(("(d) steps/s / (a) steps/s", v, ">= %.1f" % TARGET_STEPS_C_OVER_A,
                None if v is None or not judge else v >= TARGET_STEPS_C_OVER_A))
    return out


def parent(a):
    python = sys.executable
    env = environment(a, python)
    if a.device is None:
        a.device = "cuda" if env["cuda_available"] else "cpu"
    if a.device == "cuda" and not env["cuda_available"]:
        sys.exit("share_gpu: --device cuda, but torch %s sees no CUDA device" % env["torch"])
    if a.threads is None:
        a.threads = max(1, env["host_cpus"] // a.procs)
    graphd_modes = [m for m in a.modes if m in ("b", "c", "d")]
    if graphd_modes and not a.address and not a.graphd.exists():
        sys.exit("share_gpu: no %s: build it first (make -j all; on the GPU machine make "
                 "TORCH=python PYTHON=python3 all), or pass --graphd / --address" % a.graphd)

    reader = MemReader(python) if a.device == "cuda" and not a.interleave else None
    tmp = Path(tempfile.mkdtemp(prefix="share_gpu-"))
    results = []
    failed = False
    try:
        floor = statistics.median(reader.read()[0] for _ in range(3)) if reader else None
        if a.interleave:
            try:
                rounds, results = run_interleaved(a, tmp)
            except Exception as e:  # noqa: BLE001 (reported, with where)
                failed = True
                rounds, results = [], [failure(e, "interleaved", "every mode at once")]
        else:
            for mode in a.modes:
                print("share_gpu: mode (%s) ..." % mode, file=sys.stderr, flush=True)
                try:
                    results.append(run_mode(mode, a, tmp, reader, floor))
                except Exception as e:  # noqa: BLE001 (one mode failing still reports the others)
                    failed = True
                    results.append(failure(e, mode, MODES[mode][a.device != "cuda"]))
    except KeyboardInterrupt:
        shutil.rmtree(tmp, ignore_errors=True)  # interrupted on purpose: no logs worth keeping
        raise
    finally:
        if reader is not None:
            reader.close()
    if a.interleave:
        report_interleaved(a, rounds, results)
        ratios = []
    else:
        ratios = report(a, env, results, reader.source if reader else "n/a")
    if a.json:
        doc = {"config": {k: (str(v) if isinstance(v, Path) else v)
                          for k, v in vars(a).items() if k not in ("worker", "rank")},
               "environment": env, "memory_source": reader.source if reader else None,
               "results": results,
               "ratios": [{"name": n, "value": v, "target": t, "met": m}
                          for n, v, t, m in ratios]}
        if a.interleave:
            doc["rounds"] = rounds
        text = json.dumps(doc, indent=2)
        if a.json == "-":
            print(text)
        else:
            Path(a.json).write_text(text + "\n")
    if failed or a.keep_logs:
        print("share_gpu: logs kept in %s" % tmp, file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=8, help="training processes (default 8)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per process")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="run the timed phase for this long instead of --steps")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps after capture")
    ap.add_argument("--modes", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="default: cuda when torch has it, else the CPU substitutes")
    ap.add_argument("--graphd", type=Path, default=None,
                    help="daemon binary, one fresh daemon per graphd mode (default build/graphd)")
    ap.add_argument("--daemon-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for each fresh daemon, e.g. "
                    "--daemon-arg=--replay-spin-slice-us=0 (repeatable)")
    ap.add_argument("--address", help="use this running daemon instead (its idle memory is "
                    "then in the baseline)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per worker (default: CPUs available / --procs)")
    ap.add_argument("--sample-interval", type=float, default=0.2, help="seconds between reads")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds to wait for all workers to be ready, and again to be done")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="start every mode's workers first, then ROUNDS rounds of one timed "
                    "window per mode, the order reversed every other round (no memory "
                    "figures); for steps/s ratios on a host whose speed drifts")
    ap.add_argument("--phases", action="store_true",
                    help="workers also time each phase of the step on the host (zero_grad, "
                    "forward, loss, backward, optimizer) and the report gives their means")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the workers' and daemons' logs (stderr) also when nothing failed; "
                    "e.g. for GRAPHD_REPLAY_PROFILE's lines")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="also write the results as JSON to PATH (stdout without one)")
    # internal: one worker process
    ap.add_argument("--worker", choices=tuple(MODES), help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pool", help=argparse.SUPPRESS)
    ap.add_argument("--pool-device", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.worker:
        return worker(a)

    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not a.modes or any(m not in MODES for m in a.modes):
        ap.error("--modes takes a comma-separated subset of a,b,c")
    if min(a.procs, a.batch, a.width, a.depth) < 1 or a.steps < 1 and not a.seconds:
        ap.error("--procs, --batch, --width, --depth and --steps must be positive")
    if a.graphd is None:
        a.graphd = Path("build/graphd") if Path("build/graphd").exists() else REPO / "build/graphd"
    a.graphd = a.graphd.resolve()
    # The client library next to the daemon binary, unless told otherwise, so that the two
    # match; and the package PYTHONPATH names, else this tree's (for the workers too).
    if not (os.environ.get("GRAPHD_LIB") or os.environ.get("GRAPHD_BUILD")) and \
            (a.graphd.parent / "libgraphd.so").exists():
        os.environ["GRAPHD_BUILD"] = str(a.graphd.parent)
    from gd_daemon import client_on_path  # bench/, the script's own folder
    print("share_gpu: client package from %s" % client_on_path(), file=sys.stderr, flush=True)

    # SIGTERM / SIGHUP end the run like Ctrl-C does, through the cleanup in the finally blocks.
    def interrupted(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    try:
        return parent(a)
    except KeyboardInterrupt:
        print("share_gpu: interrupted; workers and daemons stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
