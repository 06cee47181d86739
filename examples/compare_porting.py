#!/usr/bin/env python3
"""Runs examples/porting.cc (under ddprun) and examples/porting.py (under
PyTorch's torchrun) on 2 ranks and compares the losses they print every
LOG_EVERY steps: the port is faithful when every (epoch, step) is printed
by both, with losses within --tolerance (default 1e-3: the two reduce
gradients in different float orders, and print 4 decimals).

Usage: compare_porting.py DDPRUN PORTING_BINARY PYTHON [--tolerance T]
Exit status: 0 same losses; 1 a difference (each named); 77 (skipped) when
PYTHON cannot import torch.
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

LINE = re.compile(r"epoch (\d+) step (\d+): loss ([0-9.]+)")


def losses(command):
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"compare_porting: {command[0]} ... exited {proc.returncode}")
    return {(int(e), int(s)): float(l) for e, s, l in LINE.findall(proc.stdout)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddprun")
    ap.add_argument("binary")
    ap.add_argument("python")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    if subprocess.run([args.python, "-c", "import torch.distributed.run"],
                      capture_output=True).returncode != 0:
        print(f"compare_porting: {args.python} has no torch.distributed: skipped")
        return 77
    script = pathlib.Path(__file__).with_name("porting.py")
    cpp = losses([args.ddprun, "--standalone", "--nproc-per-node", "2", args.binary])
    with tempfile.TemporaryDirectory(prefix="ddp-porting-") as logs:  # not in TMPDIR
        py = losses([args.python, "-m", "torch.distributed.run", "--standalone",
                     "--nproc-per-node", "2", "--log_dir", logs, str(script)])
    problems = []
    if not cpp:
        problems.append("porting.cc printed no 'epoch E step S: loss X' line")
    if sorted(cpp) != sorted(py):
        problems.append(f"different steps printed: C++ {sorted(cpp)}, Python {sorted(py)}")
    for key in sorted(set(cpp) & set(py)):
        if abs(cpp[key] - py[key]) > args.tolerance:
            problems.append(f"epoch {key[0]} step {key[1]}: C++ loss {cpp[key]}, "
                            f"Python {py[key]}")
    for p in problems:
        print(f"compare_porting: {p}")
    if not problems:
        print(f"compare_porting: {len(cpp)} losses agree within {args.tolerance}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
