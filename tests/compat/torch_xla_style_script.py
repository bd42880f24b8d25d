"""A training script written for torch_xla, as its docs write one (docs/source/perf/fsdp_spmd.md
and spmd_basic.md): ``x = xs.mark_sharding(x, ...)`` fed to the model, FSDPv2 over a global mesh,
weights sharded by hand, backward and an optimizer step. Prints one JSON line of losses.

The test runs it as is (torch_xla) and with only ``torch_xla.distributed.spmd`` in its imports
changed to ``spmd`` (tests/compat/run_torch_xla_spmd_tests.py's ``ours``), and compares.
"""

import json
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

xr.use_spmd()
torch.manual_seed(0)
device = torch_xla.device()
num_devices = xr.global_runtime_device_count()


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


# 1. The SPMD user guide's pattern: weights sharded by hand on a 2-D mesh.
mesh = xs.Mesh(np.array(range(num_devices)), (num_devices // 2, 2), ("data", "model"))
model = MLP().to(device)
xs.mark_sharding(model.fc1.weight, mesh, ("model", None))
xs.mark_sharding(model.fc2.weight, mesh, (None, "model"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(64, 32)
target = torch.randn(64, 8)
spmd_losses = []
for _ in range(4):
    x = data.to(device)
    x = xs.mark_sharding(x, mesh, ("data", None))
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), target.to(device))
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    spmd_losses.append(loss.item())

# 2. The FSDPv2 guide's pattern: a global 'fsdp' mesh, x = xs.mark_sharding(x, ...), Adam.
fsdp_mesh = xs.Mesh(np.array(range(num_devices)), (num_devices, 1), ("fsdp", "model"))
xs.set_global_mesh(fsdp_mesh)
torch.manual_seed(1)
model = FSDPv2(MLP())  # the global mesh
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
fsdp_losses = []
for _ in range(4):
    x = data.to(device)
    x = xs.mark_sharding(x, fsdp_mesh, ("fsdp", None))
    optimizer.zero_grad()
    output = model(x)
    loss = (output - target.to(device)).square().sum()
    loss.backward()
    optimizer.step()
    torch_xla.sync()
    fsdp_losses.append(loss.item())

print(json.dumps({"spmd": spmd_losses, "fsdp": fsdp_losses, "xs": xs.__name__}))
