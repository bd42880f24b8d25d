"""Run under torchrun by tests/spmd/test_dtensor_backend.py (test_processes_exit_cleanly): ends
right after collectives, holding the GIL (a long switch interval stands for a script busy in
Python to its end), with no destroy_process_group. The gloo workers that drop the collectives
need the GIL, and get it only from the exit hook; without it torch 2.15 aborted ("terminate
called without an active exception"). Four asynchronous collectives on both axes' groups leave
more workers waiting than one."""

import sys

import numpy as np
import torch
import torch.distributed as dist

import spmd
from mesh import Mesh

dist.init_process_group("gloo")
n = dist.get_world_size()
device_mesh = spmd.device_mesh(Mesh(np.arange(n).reshape(2, n // 2), (2, n // 2), ("a", "b")))
sys.setswitchinterval(60)
pending = [dist.all_reduce(torch.ones(8), group=device_mesh.get_group(axis), async_op=True) for axis in "abab"]
dist.all_reduce(torch.ones(8), group=device_mesh.get_group("a"))
