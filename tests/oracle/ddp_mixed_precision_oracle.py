#!/usr/bin/env python3
"""DDP's mixed precision (PyTorch's _MixedPrecision), step by step at world
size 2, the oracle of tests/mixed_precision_test.cc.

  PYTHON ddp_mixed_precision_oracle.py OUT.json

PyTorch 2.13's DistributedDataParallel(mixed_precision=...) does not run on
CPU ("cpu backend doesn't support events"; with the events stubbed out its
gradients are garbage), so this script computes what it specifies, with
PyTorch's own kernels, two ranks in one process:
  - before each forward, every parameter is cast to param_dtype (a defined
    gradient too) and floating-point inputs are cast to param_dtype;
  - buffers are cast to buffer_dtype once (floating-point ones), and rank
    0's are copied to the other rank before a forward when the previous
    forward synchronised gradients (PyTorch's broadcast_buffers rule);
  - gradients accumulate in param_dtype; at a synchronised backward each
    rank's gradient is cast to reduce_dtype and divided by 2 there, the two
    are added in reduce_dtype (one rounding, as Gloo's and ddp's shared
    memory sum of two), and the result is cast to float32 into .grad();
  - torch.optim.SGD (lr 0.1, momentum 0.9) steps the float32 parameters.
Configurations: bf16 parameters reduced in float32 with bf16 buffers;
bf16 everywhere (reduce_dtype unset: param_dtype); reduce_dtype bf16 only.
(ATen's CPU batch norm takes bf16 parameters only with bf16 statistics,
hence buffer_dtype bf16 with param_dtype bf16.)
Step 3 of each run accumulates two micro-batches, the first under no_sync.
The model (tests/mixed_precision_test.cc builds the same): linear 6->4,
batch norm over 4 features, relu, linear 4->3; the loss is 10 x
cross-entropy of the float32 logits. Inputs are formulas of the index.
"""
import json
import sys

import torch
import torch.nn.functional as F

# torch's default intra-op threads, as the C++ test's (float32 reductions
# depend on the thread count).


def values(n, scale, shift):
    return [((i * 7 + shift) % 11 - 5) * scale for i in range(n)]


def params():
    shapes = [((4, 6), 0.1, 1), ((4,), 0.05, 2), ((4,), 0.1, 6), ((4,), 0.05, 7),
              ((3, 4), 0.1, 3), ((3,), 0.05, 4)]
    out = []
    for shape, scale, shift in shapes:
        n = 1
        for d in shape:
            n *= d
        out.append(torch.tensor(values(n, scale, shift), dtype=torch.float32).view(*shape))
    out[2] = out[2] + 1.0  # batch norm weight around 1
    return out


def batch(step, rank, micro):
    x = torch.tensor(values(24, 0.5, 5 + step * 3 + rank * 13 + micro * 29),
                     dtype=torch.float32).view(4, 6)
    y = torch.tensor([(i + step + rank + micro) % 3 for i in range(4)], dtype=torch.long)
    return x, y


def forward(p, buf, x):
    h = F.linear(x, p[0], p[1])
    h = F.batch_norm(h, buf[0], buf[1], p[2], p[3], training=True, momentum=0.1, eps=1e-5)
    return F.linear(F.relu(h), p[4], p[5])


def run(param_dtype, reduce_dtype, buffer_dtype, steps=5):
    full = params()
    bufs = []
    for _ in range(2):
        b = [torch.zeros(4), torch.ones(4)]
        if buffer_dtype is not None:
            b = [t.to(buffer_dtype) for t in b]
        bufs.append(b)
    low = param_dtype or torch.float32
    red = reduce_dtype or low
    for t in full:
        t.requires_grad_()
    opt = torch.optim.SGD(full, lr=0.1, momentum=0.9, foreach=False)
    sync_before = True  # the previous forward synchronised
    out = []
    for step in range(steps):
        micro_steps = 2 if step == 3 else 1
        grads = [[None] * len(full) for _ in range(2)]
        for micro in range(micro_steps):
            synced = micro == micro_steps - 1
            if sync_before:
                bufs[1] = [t.clone() for t in bufs[0]]
            for rank in range(2):
                p = [t.detach().to(low).requires_grad_() for t in full]
                x, y = batch(step, rank, micro)
                logits = forward(p, bufs[rank], x.to(low))
                loss = F.cross_entropy(logits.float(), y) * 10.0
                loss.backward()
                for i, t in enumerate(p):
                    g = grads[rank][i]
                    grads[rank][i] = t.grad if g is None else g.to(low) + t.grad
            sync_before = synced
        with torch.no_grad():
            for i, t in enumerate(full):
                g = (grads[0][i].to(red) / 2) + (grads[1][i].to(red) / 2)
                t.grad = g.to(torch.float32)
        opt.step()
        out.append({"params": [v for t in full for v in t.flatten().tolist()],
                    "buffers": [v for t in bufs[0] for v in t.float().flatten().tolist()]})
    return out


def main():
    result = {
        "bf16_params_fp32_reduce": run(torch.bfloat16, torch.float32, torch.bfloat16),
        "bf16": run(torch.bfloat16, None, torch.bfloat16),
        "bf16_reduce_only": run(None, torch.bfloat16, None),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
