#!/usr/bin/env python3
"""Runs one example program (under ddprun) for CTest and checks its output.

  run_example.py [--clean DIR] [--exit N] [--expect REGEX]... [--reject REGEX]...
                 -- COMMAND...

--clean DIR    remove DIR before running (a checkpoint directory left by an
               earlier run would make the program resume instead of start).
--exit N       the exit status required (default 0).
--expect RE    a regular expression (Python re, MULTILINE) that stdout and
               stderr together must match; repeatable.
--reject RE    one they must not match; repeatable.
Prints the program's output, then each failed check; exits 1 on any.
"""
import argparse
import re
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clean")
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--reject", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command after --")
    if args.clean:
        shutil.rmtree(args.clean, ignore_errors=True)
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout)
    out = proc.stdout
    sys.stdout.write(out)
    problems = []
    if proc.returncode != args.exit:
        problems.append(f"exit status {proc.returncode}, expected {args.exit}")
    for pattern in args.expect:
        if not re.search(pattern, out, re.MULTILINE):
            problems.append(f"output does not match {pattern!r}")
    for pattern in args.reject:
        m = re.search(pattern, out, re.MULTILINE)
        if m:
            problems.append(f"output matches {pattern!r}: {m.group(0)!r}")
    for p in problems:
        print(f"run_example: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
