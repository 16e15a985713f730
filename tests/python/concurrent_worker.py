"""One process of a torchrun-like start (issue 18), run by capture_at_once() in conftest.py:
`concurrent_worker.py RANK DEVICE` builds a small MLP and its eager twin on DEVICE ("cpu" or
"cuda"), prints "ready", waits for a line on stdin (the barrier: every process captures at the
same moment), captures through graphd, trains 20 steps with each and prints "done ok" when the
losses agree."""
import copy
import sys

import torch
import torch.nn as nn

import graphd

rank, device = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(rank)
layers = []
for i in range(3):
    layers += [nn.Linear(64, 64)] + ([nn.ReLU()] if i < 2 else [])
eager = nn.Sequential(*layers).to(device)
model = copy.deepcopy(eager)
x = torch.randn(16, 64, device=device)
y = torch.randn(16, 64, device=device)
if device == "cuda":
    torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
g = graphd.make_graphed_callables(model, (x.clone(),))
opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
opt_g = torch.optim.SGD(model.parameters(), lr=0.05)
losses = {}
for name, m, opt in (("eager", eager, opt_e), ("graphd", g, opt_g)):
    out = losses[name] = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
torch.testing.assert_close(torch.tensor(losses["graphd"]), torch.tensor(losses["eager"]),
                           rtol=1e-4, atol=1e-5)
print("done ok", flush=True)
