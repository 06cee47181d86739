#!/usr/bin/env python3
"""PyTorch's own torch.nn.SyncBatchNorm on CUDA, the oracle of ddp's
(Gpu.SyncBatchNormOnCudaEqualsPyTorchsSyncBatchNorm in tests/gpu_test.cc).

Reads IN.json, written by that test: "world", "shape" (the whole batch,
[N, C, H, W]), "x" (its values, flat), "weight", "bias". Each of `world`
processes takes its N/world rows to cuda:0; they form a gloo group (NCCL
refuses two ranks on one GPU; PyTorch's SyncBatchNorm all_gathers through
gloo with CUDA tensors), run SyncBatchNorm2d forward in training mode and
backward of sum(y * sin(y.detach())), and rank r writes OUT.json.<r>: y,
x.grad, weight.grad, bias.grad, running_mean, running_var (flat lists).

PyTorch refuses SyncBatchNorm on CPU tensors, so this runs on GPU machines
only (scripts/gpu-check.sh).

Usage: PYTHON sync_batchnorm_cuda.py IN.json OUT.json
"""
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from rank_exit import end_rank  # Note [Oracle ranks end with os._exit]


def flat(t):
    return t.detach().double().cpu().reshape(-1).tolist()


def worker(rank, spec, init_file, out_path):
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=spec["world"])
    n, c = spec["shape"][0], spec["shape"][1]
    rows = n // spec["world"]
    x = torch.tensor(spec["x"], dtype=torch.float32).view(spec["shape"])
    x = x[rank * rows:(rank + 1) * rows].to("cuda:0").requires_grad_(True)
    bn = nn.SyncBatchNorm(c).to("cuda:0")
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(spec["weight"]))
        bn.bias.copy_(torch.tensor(spec["bias"]))
    bn.train()
    y = bn(x)
    (y * y.detach().sin()).sum().backward()
    torch.cuda.synchronize()
    out = {"y": flat(y), "x_grad": flat(x.grad), "weight_grad": flat(bn.weight.grad),
           "bias_grad": flat(bn.bias.grad), "running_mean": flat(bn.running_mean),
           "running_var": flat(bn.running_var)}
    tmp = f"{out_path}.{rank}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, f"{out_path}.{rank}")
    end_rank()


def main():
    spec = json.load(open(sys.argv[1]))
    if not torch.cuda.is_available():
        sys.exit("sync_batchnorm_cuda.py: no CUDA device (PyTorch's SyncBatchNorm needs one)")
    fd, init_file = tempfile.mkstemp(prefix="ddp-sbn-oracle-")
    os.close(fd)
    os.unlink(init_file)
    try:
        mp.spawn(worker, args=(spec, init_file, sys.argv[2]), nprocs=spec["world"], join=True)
    finally:  # the file store's file outlives its group: nothing left in /tmp
        if os.path.exists(init_file):
            os.unlink(init_file)


if __name__ == "__main__":
    main()
