"""The model every CUDA benchmark of issue 5 trains (bench/ scripts import it from their own
folder): an MLP of depth Linear(width, width) layers with a ReLU between each two, named by
(batch, width, depth) in the benchmarks."""


def mlp(width, depth):
    import torch.nn as nn  # here, so that share_gpu.py's parent process needs no torch
    layers = []
    for i in range(depth):
        layers += [nn.Linear(width, width)] + ([nn.ReLU()] if i < depth - 1 else [])
    return nn.Sequential(*layers)
