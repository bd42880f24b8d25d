"""Run in a subprocess by test_checkpoint.py: a small FSDP GPT on DEVICES devices loads a
checkpoint saved on another device count, writes its full state to OUT, saves again, and then
starts one more save that pauses after its first shard file (printing WRITING) to be killed.

    python checkpoint_worker.py DEVICES CKPT OUT
"""

import sys

from spmd.devices import configure_default_devices

devices, ckpt, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
configure_default_devices(devices)

import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

import fsdp_xla.checkpoint as ck  # noqa: E402
import spmd  # noqa: E402
from fsdp_xla import FSDP, transformer_auto_wrap_policy  # noqa: E402
from mesh import Mesh  # noqa: E402
from tests.fsdp_xla.helpers import GPT, SMALL, Block  # noqa: E402

spmd.enable_spmd()
if xr.global_runtime_device_count() != devices:
    sys.exit(f"expected {devices} devices, got {xr.global_runtime_device_count()}")
mesh = Mesh(np.arange(devices), (devices,), ("fsdp",))
torch.manual_seed(5)  # other weights than the saved ones: the load must overwrite them all
model = FSDP(GPT(**SMALL), mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))

print("EXTRA", ck.load_sharded(ckpt, model), flush=True)
torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out)
ck.save_sharded(ckpt, model, extra={"devices": devices})
print("SAVED", flush=True)

write = ck._save.write_device_file


def slow(path, tensors):
    write(path, tensors)
    print("WRITING", flush=True)
    time.sleep(600)


ck._save.write_device_file = slow
ck.save_sharded(ckpt, model, extra={"devices": devices, "killed": True})
