"""The PyTorch/XLA SPMD blog's snippets, run with our imports (only the imports changed).

The blog's code has two slips that we fix and mark with "blog:" comments: a typo
(``num_devicese``, ``ouput``) and a training loop without ``loss.backward()``.

    python examples/blog_snippets.py
"""

from spmd import configure_default_devices

configure_default_devices()  # 8 virtual CPU devices here; the real TPU on a TPU VM

try:
    from examples import _lane  # the repository is on the path (tests, PYTHONPATH)
except ImportError:
    import _lane  # run as a script: examples/ is on the path

_lane.exit_needing_torch_xla(__file__, "the PyTorch/XLA SPMD blog's snippets (torch_xla's API)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

import spmd as xs  # noqa: E402  (was: import torch_xla.experimental.xla_sharding as xs)
from spmd import (
    Mesh,  # noqa: E402  (was: from torch_xla.experimental.xla_sharding import Mesh)
    XLAShardedTensor,  # noqa: E402  (was: ...xla_sharded_tensor import XLAShardedTensor)
)


def mesh_section():
    # Assuming you are running on a TPU host that has 8 devices attached
    num_devices = xr.global_runtime_device_count()
    # mesh shape will be (4,2) in this example
    mesh_shape = (num_devices // 2, 2)
    device_ids = np.array(range(num_devices))
    # axis_names 'x' nad 'y' are optional
    mesh = Mesh(device_ids, mesh_shape, ("x", "y"))
    print(mesh.get_logical_mesh())
    print(mesh.shape())
    return mesh


def partition_spec_section():
    num_devices = xr.global_runtime_device_count()
    device_ids = np.array(range(num_devices))
    input_tensor = torch.randn(8, 16).to(xm.xla_device())
    # Provide optional mesh axis names and use them in the partition spec
    mesh = Mesh(device_ids, (4, 2), ("data", "model"))
    partition_spec = ("model", "data")
    xs.mark_sharding(input_tensor, mesh, partition_spec)

    input_tensor = torch.randn(8, 16).to(xm.xla_device())
    # Provide optional mesh axis names and use them in the partition spec
    mesh = Mesh(device_ids, (2, 2, 2), ("x", "y", "z"))
    # evenly shard across x and z and replicate among y
    partition_spec = ("x", "z")  # equivalent to ('x', None, 'z')
    return xs.mark_sharding(input_tensor, mesh, partition_spec)


class SimpleLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(128, 64)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def simple_example(steps: int = 20) -> list[float]:
    # Enable XLA SPMD execution mode.
    xr.use_spmd()

    # Device mesh, this and partition spec as well as the input tensor shape define the individual shard shape.
    num_devices = xr.global_runtime_device_count()
    mesh_shape = (2, num_devices // 2)  # 2x4 on v3-8, 2x2 on v4-8   (blog: num_devicese)
    device_ids = np.array(range(num_devices))
    mesh = Mesh(device_ids, mesh_shape, ("x", "y"))

    t = torch.randn(8, 4).to(xm.xla_device())

    # Mesh partitioning, each device holds 1/8-th of the input
    partition_spec = (0, 1)
    m1_sharded = xs.mark_sharding(t, mesh, partition_spec)
    assert isinstance(m1_sharded, XLAShardedTensor) == True  # noqa: E712 (the blog's line)
    # Note that the sharding annotation is also in-placed updated to t

    # Sharding annotate the linear layer weights.
    model = SimpleLinear().to(xm.xla_device())
    xs.mark_sharding(model.fc1.weight, mesh, partition_spec)

    torch.manual_seed(0)
    w_true = torch.randn(128, 1)
    loader = []
    for _ in range(steps):
        data = torch.randn(16, 128)
        loader.append((data.to(xm.xla_device()), (data @ w_true / 16).to(xm.xla_device())))
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    losses = []
    # Training loop
    model.train()
    for step, (data, target) in enumerate(loader):
        # Assumes `loader` returns data, target on XLA device
        optimizer.zero_grad()
        # Sharding annotate input data, we can shard any input
        # dimensions. Sharding the batch dimension enables
        # data parallelism, sharding the feature dimension enables
        # spatial partitioning.
        xs.mark_sharding(data, mesh, partition_spec)
        output = model(data)  # blog: "ouput"
        loss = loss_fn(output, target)
        loss.backward()  # blog: missing, so nothing would train
        optimizer.step()
        xm.mark_step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    from spmd.xla_log import show_repeated_notices_once

    show_repeated_notices_once()  # XLA's per-compile GSPMD notice, once
    xr.use_spmd()  # the blog's full example starts with this; the fragments assume it
    mesh_section()
    print(partition_spec_section())
    losses = simple_example()
    print("SimpleLinear losses:", " ".join(f"{x:.3f}" for x in losses))
