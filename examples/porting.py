"""The seed's Python DDP recipe, the left column of docs/porting.md: the
same model, data, seeds and schedule as examples/porting.cc, so that the
two print the same losses (the test example_porting_matches_python runs
both and compares them).

  torchrun --standalone --nproc-per-node 2 examples/porting.py
  python -m torch.distributed.launch --nproc-per-node 2 examples/porting.py
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EPOCHS = 3
LOG_EVERY = 8  # steps between progress lines (the seed: 100)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 4)
        self.aux = torch.nn.Linear(32, 1)  # takes no part in the loss

    def forward(self, x):
        return self.head(self.body(x).relu())


def synthetic_dataset():
    """examples/synthetic.h's data: the same generator, seed and draws."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(1024, 16, generator=g)
    w = torch.randn(16, 4, generator=g)
    return TensorDataset(x, (x @ w).argmax(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", "--local-rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--no-find-unused-parameters", action="store_true")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")  # "nccl" on GPUs
    world_size = dist.get_world_size()

    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")

    batch_size = 32  # per process: the global batch is batch_size * world_size
    dataset = synthetic_dataset()
    sampler = DistributedSampler(dataset)  # rank and world size from the group
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)  # no shuffle=True
    if dist.get_rank() == 0:
        print(f"global batch {batch_size * world_size} = {batch_size} per process"
              f" x {world_size} processes")

    torch.manual_seed(0)  # the same initial weights on every rank
    model = Net().to(device)
    cuda = device.type == "cuda"
    model = DDP(model, device_ids=[args.local_rank] if cuda else None,
                output_device=args.local_rank if cuda else None,
                find_unused_parameters=not args.no_find_unused_parameters)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
        for step, (x, y) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            if step % LOG_EVERY == 0:
                mean = loss.detach().clone()
                dist.all_reduce(mean)  # a SUM: divide by the world size
                if dist.get_rank() == 0:
                    print(f"epoch {epoch} step {step}: loss {mean.item() / world_size:.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
