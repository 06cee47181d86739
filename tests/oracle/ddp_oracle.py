#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel as an oracle for ddp's C++ one.

Reads a JSON file of scenarios written by tests/ddp_oracle_test.cc (initial
weights, data, options), trains each scenario with torch.nn.parallel.
DistributedDataParallel on `world` processes (gloo, CPU), and writes every
rank-0 final state as JSON. Architectures and parameter names match
tests/support/models.h.

Usage: PYTHON ddp_oracle.py IN.json OUT.json   (PYTHON: the build's DDP_PYTHON)
"""
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from rank_exit import end_rank  # Note [Oracle ranks end with os._exit]


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BnCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 4)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x.view(-1, 1, 6, 6)))).flatten(1))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)
        self.aux = nn.Linear(16, 4)

    def forward(self, x, use_aux):
        h = F.relu(self.body(x))
        return self.head(h) + self.aux(h) if use_aux else self.head(h)


class Tied(nn.Module):
    """One weight used twice and registered twice: "w" and "sub.w_tied"."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) * 0.3)
        self.sub = nn.Module()
        self.sub.w_tied = self.w
        self.mid = nn.Linear(8, 8)

    def forward(self, x):
        return (self.mid(torch.tanh(x @ self.w)) @ self.w.t())[:, :4]


class Twice(nn.Module):
    """One block called twice; "twice_checkpointed" checkpoints each call
    with a re-entrant backward (block's gradient accumulates twice)."""

    def __init__(self, checkpointed=False):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.block = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.checkpointed = checkpointed

    def fn(self, x):
        return torch.tanh(self.block(x))

    def forward(self, x):
        x = torch.tanh(self.inp(x))
        for _ in range(2):
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(self.fn, x, use_reentrant=True)
            else:
                x = self.fn(x)
        return self.head(x)


MODELS = {"mlp": Mlp, "bncnn": BnCnn, "branchy": Branchy, "tied": Tied, "twice": Twice,
          "twice_checkpointed": lambda: Twice(checkpointed=True)}


def load_state(model, state):
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            t.copy_(torch.tensor(state[name], dtype=t.dtype).view_as(t))


def final_state(model):
    # state_dict keeps every name of a tied tensor ("w" and "sub.w_tied"),
    # as libtorch's named_parameters() does.
    return {n: t.detach().reshape(-1).tolist() for n, t in model.state_dict().items()}


def register_powersgd(ddp, name):
    """name: "powerSGD rank=R" or "batched_powerSGD rank=R", optionally
    followed by " same_shape" (batch_tensors_with_same_shape)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P
    hook, rank = name.split()[0], int(name.split()[1].split("=")[1])
    # PyTorch 2.13's batched hook hands a 2-D Q to _orthogonalize, which
    # asserts 3-D; orthogonalise it as a batch of one, as ddp does.
    original = P._orthogonalize
    if not getattr(original, "ddp_patched", False):
        def orthogonalize(matrices, epsilon=0):
            if matrices.dim() == 2:
                matrices = matrices.unsqueeze(0)
            original(matrices, epsilon)
        orthogonalize.ddp_patched = True
        P._orthogonalize = orthogonalize
    state = P.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                            random_seed=0, batch_tensors_with_same_shape="same_shape" in name)
    ddp.register_comm_hook(state, P.powerSGD_hook if hook == "powerSGD"
                           else P.batched_powerSGD_hook)


def register_hook(ddp, name):
    """The comm hook named as ddp_oracle_test.cc names ddp's built-in ones."""
    if not name:
        return
    if "powerSGD" in name:
        return register_powersgd(ddp, name)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    hooks = {
        "allreduce": dh.allreduce_hook,
        "fp16_compress": dh.fp16_compress_hook,
        # PyTorch refuses its bf16 hook by name without NCCL 2.10 or XCCL; the
        # same function under another name runs on Gloo (2.x reduces bf16).
        "bf16_compress": lambda state, bucket: dh.bf16_compress_hook(state, bucket),
        "fp16_compress_wrapper(allreduce)": dh.fp16_compress_wrapper(dh.allreduce_hook),
    }
    ddp.register_comm_hook(None, hooks[name])


def run_scenario(rank, world, sc):
    model = MODELS[sc["model"]]()
    load_state(model, sc["init"])
    ddp = nn.parallel.DistributedDataParallel(
        model,
        find_unused_parameters=sc.get("find_unused_parameters", False),
        gradient_as_bucket_view=sc.get("gradient_as_bucket_view", False),
        static_graph=sc.get("static_graph", False))
    register_hook(ddp, sc.get("comm_hook", ""))
    opt = torch.optim.SGD(ddp.parameters(), lr=sc["lr"])
    x = torch.tensor(sc["x"], dtype=torch.float32).view(sc["x_shape"])
    y = torch.tensor(sc["y"], dtype=torch.float32).view(sc["y_shape"])
    b = sc["batch"]
    acc = sc.get("accumulate", 1)
    aux_rank = sc.get("aux_rank", -1)
    if "rank_steps" in sc:  # uneven inputs under DDP's join
        with ddp.join(divide_by_initial_world_size=sc["divide_by_initial_world_size"]):
            for s in range(sc["rank_steps"][rank]):
                opt.zero_grad()
                xs = x[s, rank * b:(rank + 1) * b]
                ys = y[s, rank * b:(rank + 1) * b]
                F.mse_loss(ddp(xs), ys).backward()
                opt.step()
        return final_state(model)
    # aux_micro: the micro-step (of `accumulate`) in which aux_rank uses the
    # aux head; -1: every micro-step.
    aux_micro = sc.get("aux_micro", -1)
    for s in range(0, x.shape[0], acc):
        opt.zero_grad()
        for k in range(acc):
            xs = x[s + k, rank * b:(rank + 1) * b]
            ys = y[s + k, rank * b:(rank + 1) * b]
            use_aux = rank == aux_rank and aux_micro in (-1, k)
            args = (xs, use_aux) if sc["model"] == "branchy" else (xs,)
            if k + 1 < acc:
                with ddp.no_sync():
                    (F.mse_loss(ddp(*args), ys) / acc).backward()
            else:
                (F.mse_loss(ddp(*args), ys) / acc).backward()
        opt.step()
    return final_state(model)


def worker(rank, world, init_file, scenarios, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file,
                            rank=rank, world_size=world)
    results = [run_scenario(rank, world, sc) for sc in scenarios]
    if rank == 0:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f)
        os.replace(tmp, out_path)
    end_rank()


def main():
    spec = json.load(open(sys.argv[1]))
    fd, init_file = tempfile.mkstemp(prefix="ddp-oracle-")
    os.close(fd)
    os.unlink(init_file)
    try:
        mp.spawn(worker, args=(spec["world"], init_file, spec["scenarios"], sys.argv[2]),
                 nprocs=spec["world"], join=True)
    finally:  # the file store's file outlives its group: nothing left in /tmp
        if os.path.exists(init_file):
            os.unlink(init_file)


if __name__ == "__main__":
    main()
