#!/usr/bin/env python3
"""PyTorch's own fully_shard (FSDP2) as an oracle for ddp's C++ one.

Reads a JSON file of scenarios written by tests/fully_shard_oracle_test.cc
(initial weights, the global batches, world size, optimizer, reshard flag,
and optionally a MixedPrecisionPolicy: dtype names or null),
trains each with torch.distributed.fsdp.fully_shard on `world` processes
(gloo, CPU; the blocks first, then the root, as the C++ test shards them),
and writes, per scenario, every rank's local shard of every parameter right
after sharding and the full parameters after training. The model and its
parameter names match tests/fully_shard_oracle_test.cc's Net.

Usage: PYTHON fsdp_oracle.py IN.json OUT.json   (PYTHON: the build's DDP_PYTHON)
Exits 3 when this torch has no fully_shard (PyTorch before 2.6).
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

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:
    sys.exit(3)


class Block(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 5)
        self.b1 = Block(5, 7)
        self.b2 = Block(5, 3)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.b2(self.b1(torch.relu(self.inp(x)))))


def tensor(j):
    return torch.tensor(j["data"], dtype=torch.float32).reshape(j["shape"])


def as_json(t):
    t = t.detach().cpu().contiguous()
    return {"shape": list(t.shape), "data": t.flatten().tolist()}


def run_rank(rank, scenario, init_file, out_prefix):
    world = scenario["world"]
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    net = Net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(tensor(scenario["init"][name]))
    reshard = scenario["reshard_after_forward"]
    mp_json = scenario.get("mp") or {}
    dtype = lambda name: getattr(torch, name) if name else None
    # output_dtype on the root only: an inner unit's would feed the root's
    # own layers (head) float32 inputs.
    for unit, output in ((net.b1, None), (net.b2, None), (net, mp_json.get("output_dtype"))):
        mp_policy = MixedPrecisionPolicy(param_dtype=dtype(mp_json.get("param_dtype")),
                                         reduce_dtype=dtype(mp_json.get("reduce_dtype")),
                                         output_dtype=dtype(output))
        fully_shard(unit, reshard_after_forward=reshard, mp_policy=mp_policy)
    shards = {name: as_json(p.to_local()) for name, p in net.named_parameters()}
    if scenario["optimizer"] == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for x_json, y_json in scenario["batches"]:
        x, y = tensor(x_json), tensor(y_json)
        n = x.shape[0] // world
        opt.zero_grad()
        out = net(x[rank * n:(rank + 1) * n]).float()  # a no-op unless mixed precision
        loss = nn.functional.mse_loss(out, y[rank * n:(rank + 1) * n])
        loss.backward()
        opt.step()
    final = {name: as_json(p.full_tensor()) for name, p in net.named_parameters()}
    with open(f"{out_prefix}.{rank}.json", "w") as f:
        json.dump({"shards": shards, "final": final}, f)
    end_rank()


def main():
    scenarios = json.load(open(sys.argv[1]))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, scenario in enumerate(scenarios):
            init_file = os.path.join(tmp, f"init{i}")
            prefix = os.path.join(tmp, f"out{i}")
            mp.spawn(run_rank, args=(scenario, init_file, prefix), nprocs=scenario["world"])
            ranks = [json.load(open(f"{prefix}.{r}.json")) for r in range(scenario["world"])]
            results.append({"shards": [r["shards"] for r in ranks], "final": ranks[0]["final"]})
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
