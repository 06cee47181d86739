#!/usr/bin/env python3
"""PyTorch's own mixed precision on CPU, the oracle of ddp's GradScaler and
AutocastGuard (tests/amp_test.cc).

  PYTHON amp_oracle.py scaler OUT.json
    A two-layer MLP (float32 parameters, fixed values) trained 12 steps with
    SGD (lr 0.1, momentum 0.9) on 10 x cross-entropy and torch.amp.GradScaler(
    "cpu", init_scale=2**127, growth_interval=3): the first steps overflow and are
    skipped, later ones grow the scale. Even steps call unscale_() and
    clip_grad_norm_(max_norm 1.0) before step(). Writes per step: the scale
    after update(), whether the step was skipped, and the parameters (flat).

  PYTHON amp_oracle.py dtypes OUT.json
    The dtype of each op's result under torch.autocast("cpu", bfloat16) and
    float16, for the ops of ddp's models: linear, conv2d, batch_norm (train),
    layer_norm, softmax, log_softmax, cross_entropy, relu, max_pool2d,
    matmul, addition, mse_loss.

The inputs are formulas of the index (no random generator), so the C++ side
builds the same tensors.
"""
import json
import sys

import torch
import torch.nn.functional as F


def values(n, scale, shift):
    return [((i * 7 + shift) % 11 - 5) * scale for i in range(n)]


def mlp():
    torch.manual_seed(0)
    w1 = torch.tensor(values(24, 0.1, 1), dtype=torch.float32).view(4, 6).requires_grad_()
    b1 = torch.tensor(values(4, 0.05, 2), dtype=torch.float32).requires_grad_()
    w2 = torch.tensor(values(12, 0.1, 3), dtype=torch.float32).view(3, 4).requires_grad_()
    b2 = torch.tensor(values(3, 0.05, 4), dtype=torch.float32).requires_grad_()
    return [w1, b1, w2, b2]


def data():
    x = torch.tensor(values(48, 0.5, 5), dtype=torch.float32).view(8, 6)
    y = torch.tensor([i % 3 for i in range(8)], dtype=torch.long)
    return x, y


def scaler_run():
    params = mlp()
    x, y = data()
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=3)
    steps = []
    for step in range(12):
        opt.zero_grad()
        h = F.relu(F.linear(x, params[0], params[1]))
        loss = F.cross_entropy(F.linear(h, params[2], params[3]), y) * 10.0
        scaler.scale(loss).backward()
        if step % 2 == 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
        before = [p.detach().clone() for p in params]
        scaler.step(opt)
        skipped = all(torch.equal(a, p.detach()) for a, p in zip(before, params))
        scaler.update()
        steps.append({"scale": scaler.get_scale(), "skipped": skipped,
                      "params": [v for p in params for v in p.detach().flatten().tolist()]})
    return {"steps": steps, "state_dict": scaler.state_dict()}


def dtypes_run():
    out = {}
    x = torch.tensor(values(2 * 3 * 5 * 5, 0.25, 1)).view(2, 3, 5, 5)
    w = torch.tensor(values(4 * 3 * 3 * 3, 0.1, 2)).view(4, 3, 3, 3)
    m = torch.tensor(values(6 * 4, 0.1, 3)).view(6, 4)
    lw = torch.tensor(values(5 * 4, 0.1, 4)).view(5, 4)
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with torch.autocast("cpu", dtype=dtype):
            r = {
                "linear": F.linear(m, lw).dtype,
                "conv2d": F.conv2d(x, w).dtype,
                "batch_norm": F.batch_norm(x, None, None, training=True).dtype,
                "layer_norm": F.layer_norm(m, [4]).dtype,
                "softmax": F.softmax(m, 1).dtype,
                "log_softmax": F.log_softmax(m, 1).dtype,
                "cross_entropy": F.cross_entropy(F.linear(m, lw), y).dtype,
                "relu": F.relu(F.linear(m, lw)).dtype,
                "max_pool2d": F.max_pool2d(F.conv2d(x, w), 2).dtype,
                "matmul": torch.matmul(m, lw.t()).dtype,
                "add": (F.linear(m, lw) + 1.0).dtype,
                "mse_loss": F.mse_loss(F.linear(m, lw), torch.zeros(6, 5)).dtype,
            }
        out[name] = {k: str(v).replace("torch.", "") for k, v in r.items()}
    return out


def main():
    what, path = sys.argv[1], sys.argv[2]
    result = scaler_run() if what == "scaler" else dtypes_run()
    with open(path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
