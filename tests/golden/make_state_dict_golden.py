#!/usr/bin/env python3
"""torch.save files for tests/state_dict_test.cc, written by PyTorch itself.

Every tensor holds a value the C++ test recomputes: arange(n) / 8 + k in the
tensor's shape (k: the tensor's position), so no oracle is needed to check
what ddp::read_state_dict and ddp::load_state_dict read.

    .venv/bin/python tests/golden/make_state_dict_golden.py tests/golden/state_dict

Files (the test names them):
  net.pt          torch.save(Net().state_dict()), Net as in the test
  net_proto4.pt   the same with pickle_protocol=4 (FRAME, MEMOIZE, SHORT_BINUNICODE)
  net_ddp.pt      the state dict of DistributedDataParallel(net): "module." keys
  nested.pt       {"model": state_dict, "epoch": 3, "lr": 0.5}
  dtypes.pt       one tensor per dtype, a view sharing a storage, a transpose,
                  a 0-dim and an empty tensor
  whole_module.pt torch.save(net): a pickled nn.Module (refused by name)
  legacy.pt       _use_new_zipfile_serialization=False (refused: not a zip)
  scripted.pt     torch.jit.save(torch.jit.script(net)) (refused: TorchScript)
"""
import os
import sys
from collections import OrderedDict

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 3)
        self.bn = torch.nn.BatchNorm1d(3)
        self.fc2 = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def known(t, k):
    """arange(n) / 8 + k in t's shape and dtype."""
    v = torch.arange(t.numel(), dtype=torch.float64) / 8 + k
    return v.reshape(t.shape).to(t.dtype)


def net():
    n = Net()
    with torch.no_grad():
        for k, (name, t) in enumerate(n.state_dict().items()):
            t.copy_(known(t, k))
    return n


def main(out):
    os.makedirs(out, exist_ok=True)
    p = lambda name: os.path.join(out, name)
    n = net()
    torch.save(n.state_dict(), p("net.pt"))
    torch.save(n.state_dict(), p("net_proto4.pt"), pickle_protocol=4)
    torch.save(OrderedDict(("module." + k, v) for k, v in n.state_dict().items()),
               p("net_ddp.pt"))
    torch.save({"model": n.state_dict(), "epoch": 3, "lr": 0.5}, p("nested.pt"))
    dtypes = OrderedDict()
    for k, dt in enumerate([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                            torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                            torch.bool, torch.complex64]):
        dtypes[str(dt).replace("torch.", "")] = known(torch.empty(2, 3, dtype=dt), k)
    base = known(torch.empty(4, 5), 20)
    dtypes["base"] = base
    dtypes["row2"] = base[2]            # shares base's storage, offset 10
    dtypes["transposed"] = base.t()     # strides (1, 5)
    dtypes["scalar"] = torch.tensor(7.25)
    dtypes["empty"] = torch.empty(0, 3)
    torch.save(dtypes, p("dtypes.pt"))
    torch.save(n, p("whole_module.pt"))
    torch.save(n.state_dict(), p("legacy.pt"), _use_new_zipfile_serialization=False)
    torch.jit.save(torch.jit.script(n), p("scripted.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
