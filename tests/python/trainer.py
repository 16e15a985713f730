#!/usr/bin/env python3
"""A training process for the multi-process tests: trains a case side by side eagerly and
through graphd (pool = graphd.graph_pool_handle(NAME, device=DEVICE)) and reports on stdout,
one line each:

    captured <session id> <pid> <graph ids, comma-separated>
    step <k> <graphd loss>                  (every --every steps)
    done <steps> ok|FAIL <detail>

With --wait-go it reads one line from stdin between "captured" and training. It stops after
--steps steps or as soon as --stop-file exists. Exit status 0 when the graphd run matched the
eager one.
"""
import argparse
import os
import sys

import torch

import graphd
import gd_models


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", required=True)
    ap.add_argument("--device")
    ap.add_argument("--case", default="mlp")
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop-file")
    ap.add_argument("--wait-go", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)

    def ready(g):
        callables = g if isinstance(g, tuple) else (g,)
        ids = [str((c._graphd_runner if isinstance(c, torch.nn.Module) else c).graph.id)
               for c in callables]
        print("captured %d %d %s" % (graphd.default_client().session_id, os.getpid(),
                                     ",".join(ids)), flush=True)
        if a.wait_go:
            sys.stdin.readline()

    def step(k, loss):
        if k % a.every == 0:
            print("step %d %.8g" % (k, loss), flush=True)
        return a.stop_file is not None and os.path.exists(a.stop_file)

    pool = graphd.graph_pool_handle(a.pool, device=a.device)
    result = gd_models.train_side_by_side(gd_models.CASES[a.case], a.opt, steps=a.steps,
                                          seed=a.seed, pool=pool, on_step=step, on_ready=ready)
    n = len(result[1])
    try:
        gd_models.assert_parity(result)
    except AssertionError as e:
        print("done %d FAIL %s" % (n, str(e).replace("\n", " | ")), flush=True)
        return 1
    if not result[1][-1] < result[1][0]:
        print("done %d FAIL loss did not go down: %g -> %g" % (n, result[1][0], result[1][-1]),
              flush=True)
        return 1
    print("done %d ok" % n, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
