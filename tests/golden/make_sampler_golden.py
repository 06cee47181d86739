#!/usr/bin/python3
"""Golden values for tests/distributed_sampler_test.cc, from PyTorch itself.

Runs torch.utils.data.DistributedSampler (no process group needed: rank and
num_replicas are passed) for a fixed list of configurations and writes, per
configuration and epoch, every rank's index list, len() and the number of
its samples that are not padding. Large datasets (Fashion-MNIST's 60,000 and
10,000) are stored as digests to keep the file small. It also records
torch.randperm with seeded CPU generators, which the C++ side reproduces.

Needs Debian's python3-torch: run with /usr/bin/python3 (the python3 first
on PATH may lack torch).

    /usr/bin/python3 tests/golden/make_sampler_golden.py \
        --out tests/golden/distributed_sampler.json

The output is deterministic (sorted keys, one entry per line), so a
regenerated file compares equal to the stored one.
"""
import argparse
import json
import os
import sys
import tempfile

import torch
from torch.utils.data import DistributedSampler

# Lists longer than this are stored as digests.
FULL_LIMIT = 2000

# (dataset_size, num_replicas, shuffle, seed, drop_last, epochs)
CONFIGS = [
    (10, 3, True, 0, False, [0, 1, 2]),      # N % W != 0: padding
    (10, 3, True, 0, True, [0, 1]),          # drop_last trims the tail
    (10, 3, False, 0, False, [0]),           # no shuffle, padding
    (10, 3, False, 0, True, [0]),
    (12, 4, True, 0, False, [0, 1]),         # divisible: no padding
    (12, 4, True, 0, True, [0]),
    (2, 5, True, 0, False, [0, 1]),          # N < W: indices repeat twice+
    (2, 5, True, 0, True, [0]),              # N < W with drop_last: empty
    (1, 4, True, 3, False, [0]),
    (3, 7, False, 0, False, [0]),            # N < W, no shuffle
    (0, 2, True, 0, False, [0]),             # empty dataset
    (0, 3, True, 0, True, [0]),
    (7, 1, True, 0, False, [0, 1, 2]),       # W = 1: the whole permutation
    (7, 1, False, 0, True, [0]),
    (5, 5, True, 11, False, [0, 4]),         # one sample per rank
    (9, 2, True, 42, False, [0, 1, 2, 3]),
    (9, 2, True, 42, True, [0, 1]),
    (100, 8, True, 7, False, [0, 1, 2, 3]),
    (100, 8, True, 7, True, [3]),
    (33, 4, True, 12345, False, [0, 5]),
    (17, 3, True, -3, False, [0, 1, 2, 3, 4]),   # seed + epoch crosses 0
    (1000, 3, True, 0, False, [0, 1]),
    (1001, 2, True, 2024, True, [0]),
    (60000, 2, True, 0, False, [0, 1]),      # Fashion-MNIST train set
    (60000, 3, True, 0, False, [0]),
    (60000, 4, True, 0, True, [0]),
    (10000, 3, False, 0, False, [0]),        # Fashion-MNIST test set
    (10000, 4, True, 5, False, [1]),
]

# (n, seed) for torch.randperm(n, generator=torch.Generator().manual_seed(seed))
RANDPERM = [(1, 0), (2, 0), (5, 0), (10, 1), (16, 42), (100, 7),
            (50, -1), (50, 2**63 + 5), (300, 123456789)]


def digest(values):
    """Length, first and last 16 values, and sum((i+1) * v): fits int64 for
    the sizes used here and changes with any reordering."""
    return {
        "len": len(values),
        "head": values[:16],
        "tail": values[-16:],
        "weighted_sum": sum((i + 1) * v for i, v in enumerate(values)),
    }


def num_unique(n, world, rank, total):
    # Global positions rank, rank+W, ... below the dataset size are real
    # samples; the rest are padding repeats from the start.
    return sum(1 for pos in range(rank, total, world) if pos < n)


def case(n, world, shuffle, seed, drop_last, epoch):
    ranks, lens, uniques = [], [], []
    for rank in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=rank,
                               shuffle=shuffle, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        indices = list(iter(s))
        ranks.append(indices)
        lens.append(len(s))
        uniques.append(num_unique(n, world, rank, s.total_size))
    entry = {
        "dataset_size": n, "num_replicas": world, "shuffle": shuffle,
        "seed": seed, "drop_last": drop_last, "epoch": epoch,
        "num_samples": lens, "num_unique_samples": uniques,
    }
    if n <= FULL_LIMIT:
        entry["ranks"] = ranks
    else:
        entry["digests"] = [digest(r) for r in ranks]
    return entry


def randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return {"n": n, "seed": seed,
            "perm": torch.randperm(n, generator=g).tolist()}


def render():
    cases = [case(n, w, sh, seed, dl, e)
             for (n, w, sh, seed, dl, epochs) in CONFIGS for e in epochs]
    perms = [randperm(n, seed) for (n, seed) in RANDPERM]
    dump = lambda x: json.dumps(x, sort_keys=True, separators=(",", ":"))
    lines = ["{", '"generator":"tests/golden/make_sampler_golden.py",',
             '"torch_version":%s,' % json.dumps(torch.__version__),
             '"cases":[']
    lines.append(",\n".join(dump(c) for c in cases))
    lines.append('],"randperm":[')
    lines.append(",\n".join(dump(p) for p in perms))
    lines.append("]}")
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".sampler_golden.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args()
    write_atomically(args.out, render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
