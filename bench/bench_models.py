"""The model every CUDA benchmark of issue 5 trains (bench/ scripts import it from their own
folder): an MLP of depth Linear(width, width) layers with a ReLU between each two, named by
(batch, width, depth) in the benchmarks."""


def mlp(width, depth):
    import torch.nn as nn  # here, so that share_gpu.py's parent process needs no torch
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)


# The phases of the training step, in order, whose host time timed_step() sums.
PHASES = ("zero_grad", "forward", "loss", "backward", "optimizer")


def timed_step(model, opt, x, y, acc):
    """One training step (zero_grad, forward, MSE loss, backward, SGD step), adding the host ns
    of each of PHASES to acc[k] (no synchronisation); returns the loss."""
    import time
    import torch.nn as nn
    clock = time.perf_counter_ns
    t0 = clock()
    opt.zero_grad(set_to_none=True)
    t1 = clock()
    out = model(x)
    t2 = clock()
    loss = nn.functional.mse_loss(out, y)
    t3 = clock()
    loss.backward()
    t4 = clock()
    opt.step()
    t5 = clock()
    for k, (u, v) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
        acc[k] += v - u
    return loss


def synced_steps(model, opt, x, y, steps, sync, acc):
    """timed_step() steps times, each followed by sync(): the host's own work a step, phase by
    phase in acc, with no launch waiting for the device to drain a full queue."""
    for _ in range(steps):
        timed_step(model, opt, x, y, acc)
        sync()


def timed(fn, seconds, sync):
    """Calls fn() in batches of 50, each ended by sync(), for at least `seconds`: (seconds
    taken, calls)."""
    import time
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(50):
            fn()
        n += 50
        sync()
        if time.perf_counter() - t0 >= seconds:
            return time.perf_counter() - t0, n
