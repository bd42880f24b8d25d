"""Run under torchrun by tests/spmd/test_dtensor_backend.py (test_processes_exit_cleanly): one
sharded tensor, then destroy_process_group, then the interpreter's exit. torch 2.15 aborted here
("terminate called without an active exception") when the DeviceMesh a mesh caches kept the
destroyed group's gloo workers alive into interpreter finalization."""

import numpy as np
import torch
import torch.distributed as dist

from mesh import Mesh
from spmd import P, mark_sharding

dist.init_process_group("gloo")
x = mark_sharding(torch.ones(8), Mesh(np.arange(dist.get_world_size()), (dist.get_world_size(),), ("x",)), P("x"))
assert x.full_tensor().sum().item() == 8
dist.destroy_process_group()
