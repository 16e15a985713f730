#!/usr/bin/env python3
"""Writes the TorchScript archives and reference data the graph_runtime unit test and the graph
integration tests use.

Usage: make_models.py OUTDIR

Every model is traced or scripted here at test time (nothing binary is committed). Reference
values go to OUTDIR/ref.txt, one vector per line: "<key> <count> <v1> ... <vcount>". The
training references run plain eager PyTorch (MSE loss, SGD lr 0.05, 50 steps) from the same
initial parameters the archives hold, in float32 on the CPU.
"""
import os
import sys
import zipfile
from typing import Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

STEPS = 50
LR = 0.05


class Ref:
    def __init__(self):
        self.lines = []

    def put(self, key, values):
        if isinstance(values, torch.Tensor):
            values = values.detach().reshape(-1).double().tolist()
        values = [float(v) for v in values]
        self.lines.append("%s %d %s" % (key, len(values), " ".join("%.17g" % v for v in values)))

    def write(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def mlp(n_in, n_hidden, n_out):
    return nn.Sequential(nn.Linear(n_in, n_hidden), nn.GELU(), nn.Linear(n_hidden, n_hidden),
                         nn.GELU(), nn.Linear(n_hidden, n_out))


def save_traced(module, args, path):
    traced = torch.jit.trace(module, args)
    traced.save(path)


def sgd(params):
    with torch.no_grad():
        for p in params:
            p.sub_(LR * p.grad)
            p.grad = None


def make_mlp(out, ref):
    """One callable: 3-layer GELU MLP trained for STEPS steps."""
    torch.manual_seed(1234)
    model = mlp(16, 32, 8)
    x = torch.randn(16, 16)
    y = torch.randn(16, 8)
    save_traced(model, (x,), os.path.join(out, "mlp.pt"))
    ref.put("mlp.x", x)
    ref.put("mlp.y", y)
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        sgd(model.parameters())
    ref.put("mlp.losses", losses)


def make_two(out, ref):
    """Two callables sharing one pool: b(a(x)), trained end to end."""
    torch.manual_seed(4321)
    a = mlp(16, 24, 12)
    b = mlp(12, 24, 8)
    x = torch.randn(16, 16)
    y = torch.randn(16, 8)
    save_traced(a, (x,), os.path.join(out, "two_a.pt"))
    save_traced(b, (torch.randn(16, 12),), os.path.join(out, "two_b.pt"))
    ref.put("two.x", x)
    ref.put("two.y", y)
    losses = []
    for _ in range(STEPS):
        loss = F.mse_loss(b(a(x)), y)
        losses.append(loss.item())
        loss.backward()
        sgd(list(a.parameters()) + list(b.parameters()))
    ref.put("two.losses", losses)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.lin(x)


class EvalNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.lin2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.lin2(self.drop(F.relu(self.bn(self.lin1(x)))))


class BnNet(nn.Module):
    """BatchNorm on the input; also returns copies of the running stats (outputs without grad).

    TorchScript's optimised graph reads the stats for these copies before batch_norm updates them;
    graphd runs TorchScript without graph optimisation, which reads them after as eager mode does,
    so the references come from the reloaded archive run the same way."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(5)
        self.lin = nn.Linear(5, 2)

    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.lin(self.bn(x))
        return y, self.bn.running_mean.clone(), self.bn.running_var.clone()


class BadBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.ones(3, requires_grad=True))

    def forward(self, x):
        return self.lin(x) * self.scale


class Multi(nn.Module):
    """Nested outputs, flattened as (a, {b, c}, [d]); b and d need no grad."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(4, 3)
        self.lin2 = nn.Linear(2, 3)

    def forward(self, x, y) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], List[torch.Tensor]]:
        a = self.lin1(x)
        b = x.detach().sum(1)
        c = self.lin2(y) * 2.0
        d = (x > 0).to(torch.float32)
        return a, {"b": b, "c": c}, [d]


class Throws(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        if bool(x.sum() > 1e6):
            raise ValueError("input sum too large")
        return self.lin(x)


def make_misc(out, ref):
    torch.manual_seed(99)
    torch.jit.script(Unused()).save(os.path.join(out, "unused.pt"))

    ev = EvalNet()
    with torch.no_grad():
        ev.bn.running_mean.uniform_(-0.5, 0.5)
        ev.bn.running_var.uniform_(0.5, 2.0)
    ev.eval()
    for p in ev.parameters():
        p.requires_grad_(False)
    ex = torch.randn(4, 6)
    torch.jit.script(ev).save(os.path.join(out, "eval.pt"))
    ref.put("eval.x", ex)
    ref.put("eval.out", ev(ex))

    # BatchNorm: sample args given explicitly, 3 warm-up iterations (forward + grad), then two
    # forward replays; the running stats must move exactly as when PyTorch runs the same
    # TorchScript module as graphd does, without graph optimisation (see BnNet: the copies it
    # returns are the stats after each update, as in eager mode).
    torch.jit.script(BnNet()).save(os.path.join(out, "bn.pt"))
    bn = torch.jit.load(os.path.join(out, "bn.pt"))
    x0 = torch.randn(6, 5)
    x1 = torch.randn(6, 5) * 2 + 1
    x2 = torch.randn(6, 5) - 3
    with torch.jit.optimized_execution(False):
        for _ in range(3):
            xs = x0.clone().requires_grad_(True)
            outs = bn(xs)
            torch.autograd.grad(outs[0], [xs] + list(bn.parameters()), torch.zeros_like(outs[0]))
        ref.put("bn.x0", x0)
        for i, xi in enumerate((x1, x2), 1):
            y, rm, rv = bn(xi.clone().requires_grad_(True))
            ref.put("bn.x%d" % i, xi)
            ref.put("bn.y%d" % i, y)
            ref.put("bn.rm%d" % i, rm)
            ref.put("bn.rv%d" % i, rv)

    torch.jit.script(BadBuffer()).save(os.path.join(out, "badbuf.pt"))

    m = Multi()
    torch.jit.script(m).save(os.path.join(out, "multi.pt"))
    mx = torch.randn(5, 4, requires_grad=True)
    my = torch.randn(5, 2)
    a, bc, dl = m(mx, my)
    ga = torch.randn_like(a)
    gc = torch.randn_like(bc["c"])
    grads = torch.autograd.grad([a, bc["c"]], [mx] + list(m.parameters()), [ga, gc])
    ref.put("multi.x", mx)
    ref.put("multi.y", my)
    ref.put("multi.ga", ga)
    ref.put("multi.gc", gc)
    ref.put("multi.a", a)
    ref.put("multi.b", bc["b"])
    ref.put("multi.c", bc["c"])
    ref.put("multi.d", dl[0])
    ref.put("multi.gx", grads[0])
    for (name, _), g in zip(m.named_parameters(), grads[1:]):
        ref.put("multi.g." + name, g)

    torch.jit.script(Throws()).save(os.path.join(out, "throws.pt"))

    # A well-formed ZIP that is not a TorchScript archive.
    with zipfile.ZipFile(os.path.join(out, "notmodel.pt"), "w") as z:
        z.writestr("notmodel/readme.txt", "not a module\n")
    # A TorchScript archive whose code does not compile.
    with zipfile.ZipFile(os.path.join(out, "throws.pt")) as src, \
            zipfile.ZipFile(os.path.join(out, "badcode.pt"), "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("code/__torch__.py"):
                data = b"class Throws(Module):\n  def forward(self x) -> Tensor:\n    return x\n"
            dst.writestr(info.filename, data)


class View(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(4.0))

    def forward(self, x):
        return x + self.b.sum()


def make_bad_views(out):
    """Archives whose tensor view reaches outside its storage (16 bytes): data.pkl's size and
    stride for the buffer edited, as a crafted archive would have them. badview.pt: shape
    (16384,), a 64 KiB view; negview.pt: storage offset -1."""
    path = os.path.join(out, "view.pt")
    torch.jit.trace(View(), (torch.zeros(2),)).save(path)
    args = b"K\x00(K\x04t(K\x01t"  # offset 0, size (4,), stride (1,)
    for name, edited in (("badview.pt", b"K\x00(M\x00\x40t(K\x01t"),
                         ("negview.pt", b"J\xff\xff\xff\xff(K\x04t(K\x01t")):
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(os.path.join(out, name), "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith("/data.pkl"):
                    if data.count(args) != 1:
                        sys.exit("make_models.py: view.pt's data.pkl has no single %r" % args)
                    data = data.replace(args, edited)
                dst.writestr(info.filename, data)


class ReadsFile(nn.Module):
    """Maps a file the daemon can open (here /etc/passwd) and adds its first byte."""

    def forward(self, x):
        f = torch.from_file("/etc/passwd", False, 4, dtype=torch.uint8)
        return x + f[0].float()


class ReadsFileAtLoad(nn.Module):
    """Maps a file while the archive loads: torch::jit::load runs __setstate__."""

    def __init__(self):
        super().__init__()
        self.t = torch.zeros(4, dtype=torch.uint8)

    def forward(self, x):
        return x + self.t[0].float()

    @torch.jit.export
    def __getstate__(self):
        return (self.t, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        self.t = torch.from_file("/etc/passwd", False, 4, dtype=torch.uint8)
        self.training = state[1]


class AliasPastStorage(nn.Module):
    """A view past its input's storage at run time (libtorch 1.13 does not check it)."""

    def forward(self, x):
        return torch.ops.aten._reshape_alias(x, [4096], [1]).sum() + x


class ForeignOp(nn.Module):
    """An operator outside aten/prim/quantized (profiler::)."""

    def forward(self, x):
        h = torch.ops.profiler._record_function_enter("graphd", None)
        torch.ops.profiler._record_function_exit(h)
        return x + 1


class Hungry(nn.Module):
    """Allocates `numel` floats of host memory `rounds` times in every forward, each freed before
    the next, beside a small computation."""

    def __init__(self, numel: int, rounds: int):
        super().__init__()
        self.numel = numel
        self.rounds = rounds
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        for _ in range(self.rounds):
            big = torch.ones(self.numel)
            y = y + big[-1]
        return y


class Forever(nn.Module):
    """A forward that never returns."""

    def forward(self, x):
        i = 0
        while i >= 0:
            i = i + 1
        return x + i


class Stall(nn.Module):
    """Loops x[0] times holding x[1] floats: a capture's random sample args keep both small, a
    replay after the client writes big values there runs (or holds) as long as it likes."""

    def forward(self, x):
        big = torch.ones(int(abs(float(x[1]))) + 1)
        i = 0.0
        limit = float(x[0])
        while i < limit:
            i = i + 1.0
        return x * 2.0 + big[-1]


def make_hungry(out):
    """hungry.pt: 256 MiB in one forward; churn.pt: 1 MiB 40 times in one forward."""
    torch.manual_seed(321)
    torch.jit.script(Hungry(64 << 20, 1)).save(os.path.join(out, "hungry.pt"))
    torch.jit.script(Hungry(256 << 10, 40)).save(os.path.join(out, "churn.pt"))
    torch.jit.script(Forever()).save(os.path.join(out, "forever.pt"))
    torch.jit.script(Stall()).save(os.path.join(out, "stall.pt"))


def make_reaching(out):
    """Modules whose code reaches outside their tensors: fromfile.pt (forward maps a file),
    setstate.pt (__setstate__ maps one while the archive loads), alias.pt (a view past its
    storage), foreign.pt (a profiler:: op) and foreign_split.pt (the same with the op's name
    split over a line join, as a crafted archive may write it)."""
    for name, cls in (("fromfile.pt", ReadsFile), ("setstate.pt", ReadsFileAtLoad),
                      ("alias.pt", AliasPastStorage), ("foreign.pt", ForeignOp)):
        torch.jit.script(cls()).save(os.path.join(out, name))
    with zipfile.ZipFile(os.path.join(out, "foreign.pt")) as src, \
            zipfile.ZipFile(os.path.join(out, "foreign_split.pt"), "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("code/__torch__.py"):
                if b"ops.profiler." not in data:
                    sys.exit("make_models.py: foreign.pt's code has no ops.profiler.")
                data = data.replace(b"ops.profiler.", b"ops \\\n  . profiler.")
            dst.writestr(info, data)


def make_bomb(out):
    """bomb.pt: mlp.pt with one more file of 8 MiB of zeros, deflated to a few kilobytes (a
    small zip bomb)."""
    with zipfile.ZipFile(os.path.join(out, "mlp.pt")) as src, \
            zipfile.ZipFile(os.path.join(out, "bomb.pt"), "w") as dst:
        prefix = src.namelist()[0].split("/")[0]
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr(prefix + "/extra/zeros", bytes(8 << 20), compress_type=zipfile.ZIP_DEFLATED)


def make_big(out, ref):
    """A module over 1 MiB (libgraphd sends it through a shared region rather than inline)."""
    torch.manual_seed(777)
    lin = nn.Linear(640, 512)  # 1.3 MB of parameters
    x = torch.randn(3, 640)
    save_traced(lin, (x,), os.path.join(out, "big.pt"))
    ref.put("big.x", x)
    ref.put("big.y", lin(x))


class Tied(nn.Module):
    """Two layers sharing one weight, and a buffer: saved with every parameter and the buffer as
    one value expanded to its shape (stride 0), as the Python client saves its archives."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)
        self.l2.weight = self.l1.weight
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))) * self.scale


def make_expanded(out, ref):
    torch.manual_seed(888)
    m = Tied()
    with torch.no_grad():
        for p, v in ((m.l1.weight, 0.25), (m.l1.bias, 0.5), (m.l2.bias, -0.125)):
            p.data = torch.full((), v).expand(p.shape)
    m.scale = torch.full((), 2.0).expand(8)
    x = torch.randn(4, 8)
    torch.jit.script(m).save(os.path.join(out, "expanded.pt"))
    ref.put("expanded.x", x)
    ref.put("expanded.out", m(x))


class Slow(nn.Module):
    """A forward that takes long on purpose: 64 rounds of tanh(x @ w) with one 256x256 weight, so
    its cost grows with the batch the caller captures it at (test_devices.c's [256, 256] input:
    1 GFLOP, about 0.4 s with the reference BLAS on 2 cores). No parameter requires grad: no
    backward."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(256, 256) / 16, requires_grad=False)

    def forward(self, x):
        for _ in range(64):
            x = torch.tanh(x @ self.w)
        return x


def make_slow(out):
    torch.manual_seed(555)
    torch.jit.script(Slow()).save(os.path.join(out, "slow.pt"))


class DropNet(nn.Module):
    """Dropout in training mode: its masks come from the CPU generator."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))


class RandNet(nn.Module):
    """rand_like, randn_like and bernoulli; 15 elements, so that randn_like leaves a cached
    normal sample in the generator's state."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)

    def forward(self, x):
        y = self.lin(x)
        noise = torch.rand_like(y) + 0.1 * torch.randn_like(y)
        return y * noise + torch.bernoulli(torch.full_like(y, 0.3))


RNG_SEED = 2024


def make_random(out, ref):
    """Modules with random ops (graph_runtime's RNG_STATE). References from eager PyTorch: the
    generator state after manual_seed(RNG_SEED) ("<key>.state0"), then for two forwards in a
    row the output and the state after it ("<key>.outN", "<key>.stateN"); for DropNet also the
    weight gradient of the first forward for a grad-output of ones."""
    torch.manual_seed(31)
    drop = DropNet()
    dx = torch.randn(4, 6)
    # As the Python client traces: the trace's own check would compare two different masks.
    torch.jit.trace(drop, (dx,), check_trace=False).save(os.path.join(out, "drop.pt"))
    torch.jit.script(drop).save(os.path.join(out, "drop_script.pt"))
    rand = RandNet()
    rx = torch.randn(3, 4)
    torch.jit.script(rand).save(os.path.join(out, "rand.pt"))
    for key, module, x in (("drop", drop, dx), ("rand", rand, rx)):
        ref.put(key + ".x", x)
        torch.manual_seed(RNG_SEED)
        ref.put(key + ".state0", torch.get_rng_state())
        for i in (1, 2):
            y = module(x)
            ref.put("%s.out%d" % (key, i), y)
            ref.put("%s.state%d" % (key, i), torch.get_rng_state())
            if key == "drop" and i == 1:
                gw, = torch.autograd.grad(y, [module.lin.weight], torch.ones_like(y))
                ref.put("drop.gw1", gw)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_models.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    ref = Ref()
    make_mlp(out, ref)
    make_two(out, ref)
    make_misc(out, ref)
    make_big(out, ref)
    make_expanded(out, ref)
    make_slow(out)
    make_random(out, ref)
    make_bad_views(out)
    make_bomb(out)
    make_reaching(out)
    make_hungry(out)
    ref.write(os.path.join(out, "ref.txt"))


if __name__ == "__main__":
    main()
