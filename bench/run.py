#!/usr/bin/python3
"""bench/run.py: ddp against PyTorch's Python DDP, same machine, same run.

One command runs everything and writes bench/results/<name>.json (the
summary: machine, command, the tables' numbers),
bench/results/raw/<name>.json.gz (every run; bench/report.py says why) and
the table in BENCHMARKS.md:

  python3 bench/run.py --build-dir build-bench --name cpu-2core

For each workload and world size the sides run alternately (ddp, Python DDP,
plain; the next repeat in reverse order) so machine drift cancels; the
ratios are taken pair by pair (repeat by repeat) and summarised by their
median. Every run records its exact command, the machine's load and the CPU
time other processes took while it ran ("foreign" cores).

--smoke: tiny sizes, W=1 and 2, one repeat; checks only that the harness runs
and writes both files, readable (the CTest entry bench_smoke). Needs only
the driver's own Python; the Python DDP side needs --python with torch, by
default the build's oracle (CMake's DDP_PYTHON: the venv's torch 2.13 for
build/, Debian's python3-torch 1.13 for build-debian/), so both sides run
the very same libtorch binary.
"""
import argparse
import atexit
import datetime
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = ["mlp", "cnn", "transformer"]
SKIP = 77  # the smoke test's exit status when Python DDP is unavailable (CTest: skipped)
# (timed steps, warm-up steps) per run: a few seconds each on 2 cores.
DEFAULT_STEPS = {"mlp": (60, 10), "cnn": (30, 5), "transformer": (8, 2)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="latest", help="results file bench/results/NAME.json")
    p.add_argument("--build-dir", default=str(REPO / "build-bench"),
                   help="build tree with tools/ddprun/ddprun and bench/ddp-bench")
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--worlds", default="1,2", help="world sizes of the main results")
    p.add_argument("--oversubscribed", default="4",
                   help="world sizes above the core count, reported separately ('' none)")
    p.add_argument("--repeats", type=int, default=5, help="alternations per configuration")
    p.add_argument("--steps", type=int, default=0, help="timed steps (0: per workload)")
    p.add_argument("--warmup", type=int, default=-1, help="warm-up steps (-1: per workload)")
    p.add_argument("--sync-iters", type=int, default=30, help="iterations of sync/all_reduce")
    p.add_argument("--no-sync", action="store_true", help="skip the gradient-sync figures")
    p.add_argument("--python", default="",
                   help="interpreter with torch (default: the build's DDP_PYTHON)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: rank r uses cuda:r (bench/gpu/run.sh)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--ddp-args", default="", help="extra flags for ddp-bench (quoted)")
    p.add_argument("--python-args", default="", help="extra flags for python_ddp.py (quoted)")
    p.add_argument("--markdown", default=str(REPO / "BENCHMARKS.md"),
                   help="file whose generated section is replaced ('' none)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, quick (CTest)")
    a = p.parse_args(argv)
    cache = cmake_cache(a.build_dir)
    a.python = a.python or cache.get("DDP_PYTHON") or "/usr/bin/python3"
    a.torch_dir = cache.get("Torch_DIR", "")
    if a.smoke:
        a.name, a.worlds, a.oversubscribed, a.repeats = "smoke", "1,2", "", 1
        a.workloads = "mlp,transformer"  # every code path; the CNN only in full runs
        a.steps, a.warmup, a.sync_iters, a.markdown, a.timeout = 2, 1, 2, "", 120
    return a


def cmake_cache(build_dir):
    """The build's CMakeCache.txt entries (NAME -> value), {} without one."""
    entries = {}
    try:
        with open(Path(build_dir) / "CMakeCache.txt") as f:
            for line in f:
                if ":" in line and "=" in line and not line.startswith(("#", "//")):
                    key, _, value = line.partition("=")
                    entries[key.split(":")[0]] = value.strip()
    except OSError:
        pass
    return entries


def with_build_settings(a, argv):
    """What the side scripts (zero.py, comm_hooks.py, fully_shard.py) take
    from the build: the oracle Python (--python, else the build's
    DDP_PYTHON) and its libtorch; they run on the CPU, never as a smoke test."""
    cache = cmake_cache(a.build_dir)
    a.python = a.python or cache.get("DDP_PYTHON") or "/usr/bin/python3"
    a.torch_dir = cache.get("Torch_DIR", "")
    a.device, a.smoke, a.argv = "cpu", False, argv
    return a


def cpu_times():
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Launcher:
    """Runs one program on W ranks under ddprun and returns rank 0's JSON."""

    def __init__(self, a):
        build = Path(a.build_dir).resolve()
        self.ddprun = build / "tools" / "ddprun" / "ddprun"
        self.ddp_bench = build / "bench" / "ddp-bench"
        self.allreduce_bench = build / "bench" / "allreduce-bench"
        for exe in (self.ddprun, self.ddp_bench, self.allreduce_bench):
            if not exe.exists():
                sys.exit(f"run.py: {exe} is missing: build it (cmake --build {build} "
                         "--target ddprun ddp-bench allreduce-bench) or pass --build-dir")
        self.python = a.python
        probe = subprocess.run([a.python, "-c", "import torch"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        if probe.returncode != 0:
            print(f"run.py: {a.python} cannot import torch (Debian: python3-torch); "
                  "pass --python", file=sys.stderr)
            sys.exit(SKIP if a.smoke else 1)
        self.timeout = a.timeout
        self.env = dict(os.environ)
        # One thread per rank on both sides, the same BLAS threads, loopback.
        self.env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                        MKL_NUM_THREADS="1")
        self.env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.tmp = tempfile.mkdtemp(prefix="ddp-bench-")
        # Weights and results live here only while the script runs.
        atexit.register(shutil.rmtree, self.tmp, ignore_errors=True)
        self.hz = os.sysconf("SC_CLK_TCK")

    def run(self, world, program):
        out_json = os.path.join(self.tmp, "result.json")
        if os.path.exists(out_json):
            os.remove(out_json)
        cmd = [str(self.ddprun), "--standalone", "--nproc-per-node", str(world)]
        cmd += [str(x) for x in program] + ["--out-json", out_json]
        load0, (busy0, _), child0, t0 = loadavg(), cpu_times(), children_cpu(), time.time()
        p = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=self.timeout)
        wall = time.time() - t0
        busy1, _ = cpu_times()
        ours = children_cpu() - child0
        if p.returncode != 0 or not os.path.exists(out_json):
            raise RuntimeError(f"run.py: `{shlex.join(cmd)}` failed (exit {p.returncode}):\n"
                               + p.stdout[-4000:])
        with open(out_json) as f:
            result = json.load(f)
        result["launch"] = {
            "command": shlex.join(cmd), "wall_s": wall, "load_before": load0,
            "load_after": loadavg(),
            "foreign_cores": max(0.0, ((busy1 - busy0) / self.hz - ours) / wall)}
        return result


def device_flags(a):
    return ["--device", a.device, "--backend", a.backend]


def train_program(launcher, a, side, impl, workload, weights):
    steps, warmup = DEFAULT_STEPS[workload]
    steps = a.steps or steps
    warmup = warmup if a.warmup < 0 else a.warmup
    flags = ["--workload", workload, "--side", side, "--steps", steps,
             "--warmup", warmup, "--weights", weights] + device_flags(a)
    if a.smoke:
        flags.append("--tiny")
    if impl == "ddp":
        return [launcher.ddp_bench] + flags + shlex.split(a.ddp_args)
    return [launcher.python, REPO / "bench" / "python_ddp.py"] + flags + shlex.split(a.python_args)


def sync_program(launcher, a, impl, workload, weights, nbytes):
    flags = ["--steps" if impl != "raw" else "--iters", a.sync_iters,
             "--warmup", 3 if not a.smoke else 1] + device_flags(a)
    if impl == "raw":
        return [launcher.allreduce_bench, "--bytes", nbytes] + flags
    flags += ["--workload", workload, "--mode", "sync", "--weights", weights]
    if a.smoke:
        flags.append("--tiny")
    if impl == "ddp":
        return [launcher.ddp_bench] + flags + shlex.split(a.ddp_args)
    return [launcher.python, REPO / "bench" / "python_ddp.py"] + flags + shlex.split(a.python_args)


def make_weights(launcher, a, workload):
    """ddp-bench writes the seeded initial weights both sides then load."""
    prefix = Path(launcher.tmp) / (workload + ("-tiny" if a.smoke else ""))
    cmd = [str(launcher.ddp_bench), "--workload", workload, "--save-weights", str(prefix)]
    if a.smoke:
        cmd.append("--tiny")
    subprocess.run(cmd, check=True, env=launcher.env, timeout=launcher.timeout)
    with open(str(prefix) + ".json") as f:
        index = json.load(f)["tensors"]
    nbytes = sum(4 * max(1, _prod(t["shape"])) for t in index)
    return str(prefix), nbytes


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def alternate(items, repeat):
    """A B C on even repeats, C B A on odd ones: drift cancels in the pairs."""
    return list(items) if repeat % 2 == 0 else list(reversed(items))


def log(msg):
    print(f"[run.py {datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def bench_config(launcher, a, workload, world, weights, nbytes, runs, sync):
    # plain at W > 1: W independent loops, no communication (the ceiling).
    sides = [("ddp", "ddp"), ("python", "ddp"), ("plain", "plain")]
    for r in range(a.repeats):
        for label, side in alternate(sides, r):
            impl = "python" if label == "python" else "ddp"
            res = launcher.run(world, train_program(launcher, a, side, impl, workload, weights))
            res.update(label=label, repeat=r, kind="train")
            runs.append(res)
            log(f"{workload} W={world} {label:6s} rep {r}: {res['samples_per_s']:9.1f} samples/s"
                f"  (load {res['launch']['load_before']:.2f}, "
                f"foreign {res['launch']['foreign_cores']:.2f} cores)")
    if world < 2 or not sync:
        return
    for r in range(a.repeats):
        for impl in alternate(["ddp", "python", "raw"], r):
            res = launcher.run(world, sync_program(launcher, a, impl, workload, weights, nbytes))
            res.update(label=impl, repeat=r, kind="sync", workload=workload, world_size=world)
            runs.append(res)
            t = res["time_s"]["median"] if impl == "raw" else res["sync_s"]
            log(f"{workload} W={world} sync {impl:6s} rep {r}: {t * 1e3:8.2f} ms")


def timed_document(a, argv, launcher, measure, **settings):
    """Runs measure(a, launcher) and returns the run's document: name, start
    and end times, command, machine, the script's own `settings`, workloads
    and runs (what bench/comm_hooks.py and bench/zero.py save)."""
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    runs = measure(a, launcher)
    return {"name": a.name, "script": "bench/" + Path(sys.argv[0]).name, "started": started,
            "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, sys.argv[0]] + argv),
            "machine": machine_info(a), **settings,
            "workloads": [w for w in a.workloads.split(",") if w], "runs": runs}


def cpu_isa():
    wanted = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16"]
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return "unknown"
    return " ".join(w for w in wanted if w in flags) or "none of " + " ".join(wanted)


def machine_info(a):
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, text=True,
                                  timeout=60).stdout.strip()
        except Exception as e:  # informational only
            return f"unknown ({e})"
    model = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    return {
        "cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
        # Mixed precision's speed on a CPU depends on these (AVX2 only, or
        # AVX-512 with bfloat16/float16 instructions and AMX tiles).
        "cpu_isa": cpu_isa(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        # BLAS_INFO=mkl: the wheel's MKL, linked into libtorch_cpu; generic:
        # Debian's libblas.so.3, whichever the alternatives system selects.
        "blas": sh(f"{a.python} -c 'import re, torch; "
                   "print(re.search(\"BLAS_INFO=([^,]*)\", torch.__config__.show()).group(1))'")
                + f" (libblas.so.3 -> {blas})",
        # Both sides link one libtorch: the build's (Torch_DIR), which is the
        # oracle Python's own torch (checked at configure time).
        "libtorch": sh(f"{a.python} -c 'import torch; print(torch.__version__, "
                       "torch.__file__)'") + f" (Torch_DIR {a.torch_dir})",
        "python_torch": sh(f"{a.python} -c 'import torch; print(torch.__version__)'"),
        "compiler": sh("c++ --version | head -1"),
        "git": sh(f"git -C {REPO} rev-parse --short HEAD") +
               (" (dirty)" if sh(f"git -C {REPO} status --porcelain -- src include bench") else ""),
        "threads_per_rank": 1, "gloo_threads": 2, "loopback": "GLOO_SOCKET_IFNAME=lo",
        "gpu": sh(f"{a.python} -c 'import torch; print(torch.cuda.get_device_name(0), "
                  "torch.version.cuda)'") if a.device == "cuda" else None,
    }


def measure(launcher, a):
    worlds = [int(w) for w in a.worlds.split(",") if w]
    over = [int(w) for w in a.oversubscribed.split(",") if w]
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    runs = []
    for workload in [w for w in a.workloads.split(",") if w]:
        weights, nbytes = make_weights(launcher, a, workload)
        # The smoke test covers every code path once: all of them with the
        # MLP, the transformer's model code with one W=2 run per side.
        smoke_short = a.smoke and workload != "mlp"
        for world in ([2] if smoke_short else worlds + over):
            bench_config(launcher, a, workload, world, weights, nbytes, runs,
                         sync=not (a.no_sync or smoke_short))
    return {"name": a.name, "script": "bench/run.py", "started": started,
            "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, sys.argv[0]] + a.argv),
            "machine": machine_info(a), "worlds": worlds, "oversubscribed": over,
            "repeats": a.repeats, "smoke": a.smoke, "device": a.device,
            "backend": a.backend, "ddp_args": a.ddp_args, "python_args": a.python_args,
            "runs": runs}


def main(argv):
    a = parse_args(argv)
    a.argv = list(argv)
    launcher = Launcher(a)
    out_dir = Path(a.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        doc = measure(launcher, a)
    finally:
        shutil.rmtree(launcher.tmp, ignore_errors=True)
    # The summary as saved (report.save reads both files back: the smoke
    # test's check), and the tables from it alone.
    doc = report.save(doc, out_dir, report.summarize(doc))
    path = out_dir / f"{a.name}.json"
    log(f"wrote {path} and {out_dir / doc['raw']}")
    if a.markdown:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        report.update_markdown(Path(a.markdown), doc, shown)
        log(f"updated {a.markdown}")
    print(report.tables(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
