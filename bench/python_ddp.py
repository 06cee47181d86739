#!/usr/bin/python3
"""PyTorch's Python DDP side of the ddp benchmark (see BENCHMARKS.md).

Run under ddprun (or torchrun) with Debian's /usr/bin/python3, which has
python3-torch; the same workloads, data, weights and loop as ddp-bench
(bench/models.h, bench/bench_run.h):

  ddprun --standalone --nproc-per-node 2 /usr/bin/python3 bench/python_ddp.py \
      --workload mlp --side ddp --weights /tmp/w/mlp --out-json /tmp/r.json

--side ddp: torch.nn.parallel.DistributedDataParallel over Gloo;
--side plain: the bare Python loop (world size 1);
--mode sync: gradient synchronisation alone (see bench_run.h);
--mode allreduce: one dist.all_reduce of a flat tensor of --bytes.
Rank 0 writes its result as JSON to --out-json (or prints it).
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def workload_shape(name, tiny, batch):
    """Mirror of ddp::bench::workload_shape (bench/models.cc)."""
    s = {"name": name, "classes": 10}
    if name == "mlp":
        s.update(batch=8 if tiny else 64, hidden=32 if tiny else 1024, input=[784])
    elif name == "cnn":
        s.update(batch=4 if tiny else 64, input=[1, 28, 28])
    elif name == "transformer":
        s.update(batch=2 if tiny else 16, layers=1 if tiny else 6,
                 d_model=32 if tiny else 256, heads=2 if tiny else 4,
                 feedforward=64 if tiny else 1024, seq=8 if tiny else 64)
    else:
        raise SystemExit(f"--workload '{name}' is unknown: use mlp, cnn or transformer")
    if batch > 0:
        s["batch"] = batch
    if name == "transformer":
        s["input"] = [s["seq"], s["batch"], s["d_model"]]
    else:
        s["input"] = [s["batch"]] + s["input"]
    return s


class Mlp(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.fc1 = nn.Linear(s["input"][-1], s["hidden"])
        self.fc2 = nn.Linear(s["hidden"], s["hidden"])
        self.fc3 = nn.Linear(s["hidden"], s["classes"])

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class FashionCnn(nn.Module):
    """tools/ddp-train/model.cc, layer for layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.drop1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.drop2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), [2, 2])
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), [2, 2])
        x = self.drop1(x).flatten(1)
        x = self.drop2(F.relu(self.fc1(x)))
        return self.fc2(x)


class TransformerNet(nn.Module):
    def __init__(self, s):
        super().__init__()
        layer = nn.TransformerEncoderLayer(s["d_model"], s["heads"], s["feedforward"],
                                           dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, s["layers"], enable_nested_tensor=False)
        self.head = nn.Linear(s["d_model"], s["classes"])

    def forward(self, x):  # S x N x E -> N x classes
        return self.head(self.encoder(x).mean(0))


class SyncProbe(nn.Module):
    """loss = sum of every parameter's sum (bench_run.cc's SyncProbe)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, _):
        total = None
        for p in self.parameters():
            total = p.sum() if total is None else total + p.sum()
        return total


def make_model(s):
    if s["name"] == "mlp":
        return Mlp(s)
    if s["name"] == "cnn":
        return FashionCnn()
    return TransformerNet(s)


def make_batches(s, count, seed):
    torch.manual_seed(seed)
    return [(torch.randn(s["input"]), torch.randint(s["classes"], (s["batch"],)))
            for _ in range(count)]


def load_weights(model, prefix):
    with open(prefix + ".json") as f:
        index = json.load(f)["tensors"]
    with open(prefix + ".bin", "rb") as f:
        data = bytearray(f.read())
    params = list(model.named_parameters())
    if len(params) != len(index):
        raise SystemExit(f"weights file '{prefix}.json' has {len(index)} tensors, "
                         f"the model {len(params)} parameters")
    with torch.no_grad():
        for (name, p), e in zip(params, index):
            if e["name"] != name or list(p.shape) != e["shape"]:
                raise SystemExit(f"weights file '{prefix}.json': {e['name']} {e['shape']} "
                                 f"but the model has {name} {list(p.shape)}")
            t = torch.frombuffer(data, dtype=torch.float32, count=p.numel(),
                                 offset=e["offset"])
            p.copy_(t.view(p.shape))


def summarize(v):
    if not v:
        return {"n": 0, "median": 0.0, "p10": 0.0, "p90": 0.0, "mean": 0.0}
    v = sorted(v)
    at = lambda q: v[int(q * (len(v) - 1) + 0.5)]
    return {"n": len(v), "median": statistics.median(v), "p10": at(0.1),
            "p90": at(0.9), "mean": sum(v) / len(v)}


def ddp_stats(model):
    try:
        d = model._get_ddp_logging_data()
    except Exception:  # private API; absent in some versions
        return None
    keys = ["avg_forward_compute_time", "avg_backward_compute_time",
            "avg_backward_comm_time", "avg_backward_compute_comm_overlap_time",
            "bucket_sizes", "rebuilt_bucket_sizes", "gradient_as_bucket_view"]
    return {k: d[k] for k in keys if k in d}


def device_of(a):
    if a.device == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def sync_device(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_cpu_s():
    """CPU time of this process (all threads), as bench_run.cc measures it."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def train_loop(net, opt, batches, a, distributed):
    loss = None
    device = device_of(a)
    # --amp: as ddp-bench's (bench_run.cc): autocast around forward and loss,
    # and a GradScaler for fp16 (a pass-through otherwise).
    amp_dtype = torch.float16 if a.amp == "fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type) if a.amp == "fp16" else None

    def step(i):
        nonlocal loss
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=a.amp != "none"):
            loss = F.cross_entropy(net(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    for i in range(a.warmup):
        step(i)
    sync_device(device)
    if distributed:
        dist.barrier()
    steps = []
    t0 = time.perf_counter()
    cpu0 = process_cpu_s()
    for i in range(a.steps):
        s0 = time.perf_counter()
        step(a.warmup + i)
        sync_device(device)
        steps.append(time.perf_counter() - s0)
    cpu = process_cpu_s() - cpu0
    if distributed:
        dist.barrier()
    return time.perf_counter() - t0, steps, float(loss), cpu


def ddp_kwargs(a, sync_mode):
    ids = None if a.device == "cpu" else [device_of(a)]
    return dict(device_ids=ids, bucket_cap_mb=a.bucket_cap_mb,
                gradient_as_bucket_view=a.gradient_as_bucket_view,
                broadcast_buffers=bool(a.broadcast_buffers) and not sync_mode)


def run_train(s, a, rank, world):
    model = make_model(s)
    if a.weights:
        load_weights(model, a.weights)
    dev = device_of(a)
    model.to(dev)
    batches = [(x.to(dev), y.to(dev)) for x, y in make_batches(s, a.pool, a.seed * 1000 + rank)]
    model.eval()
    with torch.no_grad():
        out = {"eval_loss0": float(F.cross_entropy(model(batches[0][0]), batches[0][1]))}
    model.train()
    torch.manual_seed(a.seed * 1000 + 500 + rank)  # dropout
    if a.fully_shard:  # FSDP2, units as ddp-bench --fully-shard puts them
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        inner, root = MixedPrecisionPolicy(), MixedPrecisionPolicy()
        if a.fsdp_param_dtype == "bf16":  # output_dtype on the root only
            inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            root = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                        output_dtype=torch.float32)
        if s["name"] == "transformer":
            for layer in model.encoder.layers:
                fully_shard(layer, mp_policy=inner)
        fully_shard(model, mp_policy=root)
        net = model
    else:
        net = model if a.side == "plain" else DDP(model, **ddp_kwargs(a, False))
    if a.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    elapsed, steps, loss, cpu = train_loop(net, opt, batches, a, a.side == "ddp" or world > 1)
    if a.side == "ddp" and not a.fully_shard:
        out["torch_ddp_stats"] = ddp_stats(net)
    out.update(per_rank_bytes(net, opt, a.side == "ddp" or world > 1))
    out.update(elapsed_s=elapsed, samples_per_s=world * s["batch"] * a.steps / elapsed,
               step_s=summarize(steps), final_loss=loss, cpu_s_per_step=cpu / a.steps)
    return out


def local_bytes(tensors):
    """Bytes of this rank's part of each tensor (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def per_rank_bytes(net, opt, distributed):
    """As ddp-bench's: parameters, gradients, optimizer state (tensors of at
    least one dimension: PyTorch's scalar step counters are left out, as
    libtorch keeps them as integers) and peak RSS, a list over ranks."""
    params = list(net.parameters())
    state = [v for st in opt.state.values() for v in st.values()
             if torch.is_tensor(v) and v.dim() > 0]
    mine = {"param_bytes": local_bytes(params),
            "grad_bytes": local_bytes(p.grad for p in params),
            "optimizer_state_bytes": local_bytes(state),
            "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}
    if not distributed:
        return {k: [v] for k, v in mine.items()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {k: [e[k] for e in every] for k in mine}


def run_sync(s, a):
    plain, inner = make_model(s), make_model(s)
    if a.weights:
        load_weights(plain, a.weights)
        load_weights(inner, a.weights)
    dev = device_of(a)
    plain = SyncProbe(plain.to(dev))
    wrapped = DDP(SyncProbe(inner.to(dev)), **ddp_kwargs(a, True))
    dummy = torch.zeros(1)

    def once(net, module):
        module.zero_grad()
        sync_device(dev)
        dist.barrier()
        t0 = time.perf_counter()
        net(dummy).backward()
        sync_device(dev)
        return time.perf_counter() - t0

    plain_s, ddp_s = [], []
    for i in range(a.warmup + a.steps):
        p, d = once(plain, plain), once(wrapped, wrapped.module)
        if i >= a.warmup:
            plain_s.append(p)
            ddp_s.append(d)
    out = {"plain_s": summarize(plain_s), "ddp_s": summarize(ddp_s)}
    sync_s = out["ddp_s"]["median"] - out["plain_s"]["median"]
    nbytes = sum(p.numel() * p.element_size() for p in inner.parameters())
    out.update(sync_s=sync_s, gradient_bytes=nbytes,
               bandwidth_gb_s=nbytes / sync_s / 1e9 if sync_s > 0 else 0.0,
               torch_ddp_stats=ddp_stats(wrapped))
    return out


def run_allreduce(a):
    dev = device_of(a)
    t = torch.ones(max(a.bytes // 4, 1), device=dev)
    times = []
    for i in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        sync_device(dev)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    out = {"bytes": t.numel() * 4, "time_s": summarize(times)}
    out["bandwidth_gb_s"] = out["bytes"] / out["time_s"]["median"] / 1e9
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp")
    p.add_argument("--side", default="ddp", choices=["ddp", "plain"])
    p.add_argument("--mode", default="train", choices=["train", "sync", "allreduce"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=-1)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=4)
    p.add_argument("--weights", default="")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    p.add_argument("--fully-shard", action="store_true",
                   help="torch.distributed.fsdp.fully_shard (FSDP2) instead of DDP")
    p.add_argument("--fsdp-param-dtype", default="", choices=["", "bf16"],
                   help="--fully-shard with MixedPrecisionPolicy(param_dtype=bfloat16, "
                        "reduce_dtype and output_dtype float32)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--broadcast-buffers", type=int, default=1)
    p.add_argument("--bytes", type=int, default=4 << 20)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--amp", default="none", choices=["none", "bf16", "fp16"])
    p.add_argument("--out-json", default="")
    return p.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    # plain at W > 1: independent loops; the group serves only the barriers.
    distributed = (a.side == "ddp" or a.mode != "train"
                   or int(os.environ.get("WORLD_SIZE", "1")) > 1)
    if distributed:
        if a.device == "cuda":
            torch.cuda.set_device(device_of(a))
        dist.init_process_group(a.backend)
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    s = workload_shape(a.workload, a.tiny, a.batch)
    if a.mode == "train":
        out = run_train(s, a, rank, world)
    elif a.mode == "sync":
        out = run_sync(s, a)
    else:
        out = run_allreduce(a)
    if distributed:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    out.update(side=a.side, impl="torch-python", mode=a.mode, workload=a.workload,
               world_size=world, batch=s["batch"], steps=a.steps, warmup=a.warmup,
               device=a.device, backend=a.backend,
               threads=torch.get_num_threads(), gradient_as_bucket_view=a.gradient_as_bucket_view,
               bucket_cap_mb=a.bucket_cap_mb, torch_version=torch.__version__,
               optimizer=a.optimizer, fully_shard=a.fully_shard,
               fsdp_param_dtype=a.fsdp_param_dtype,
               command=[sys.executable] + sys.argv)
    text = json.dumps(out, indent=1) + "\n"
    if not a.out_json:
        print(text, end="")
        return 0
    tmp = a.out_json + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.out_json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
