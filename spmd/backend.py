"""The backend seam: what ``fsdp_xla`` and the tools may rely on of the two backends.

A backend is how a sharding becomes real: ``torch_xla`` (GSPMD on lazy XLA tensors, the torch_xla
lane) or ``dtensor`` (``torch.distributed`` DTensor, one process per device). Both implement
`ShardingBackend`; `backend_for` picks one for a tensor and `use_backend` fixes the choice
(``spmd.backend_for`` and ``spmd.use_backend`` are the same functions).

What else is public here:

- `TorchXlaBackend`, `DTensorBackend`: the two implementations.
- `torch_xla_backend`: the torch_xla backend's own operations, which only lazy XLA tensors have
  (``is_xla_tensor``, ``sharding_of``, ``step_functions``, ...); the one user of
  ``torch_xla._XLAC``.
- `dtensor_device_mesh`, `device_type_of`, `process_index`, `process_count`: DTensor's meshes
  and processes as the DTensor backend sees them.
- `agree`, `spec_text`: every rank checks that all ranks make the same call (and the text a
  spec shows in its message); `agree_on_arguments`: the same after a call's own argument checks,
  which a rank refusing alone still joins.

The implementation lives in ``spmd._backend`` (private to ``spmd``).
"""

from spmd._backend import BACKENDS as BACKENDS
from spmd._backend import ShardingBackend as ShardingBackend
from spmd._backend import backend_for as backend_for
from spmd._backend import torch_xla_backend as torch_xla_backend
from spmd._backend import use_backend as use_backend
from spmd._backend.agreement import agree as agree
from spmd._backend.agreement import agree_on_arguments as agree_on_arguments
from spmd._backend.agreement import mesh_text as mesh_text
from spmd._backend.agreement import spec_text as spec_text
from spmd._backend.dtensor_backend import DTensorBackend as DTensorBackend
from spmd._backend.dtensor_backend import device_mesh as dtensor_device_mesh
from spmd._backend.dtensor_backend import device_type_of as device_type_of
from spmd._backend.dtensor_processes import process_count as process_count
from spmd._backend.dtensor_processes import process_index as process_index
from spmd._backend.torch_xla_backend import TorchXlaBackend as TorchXlaBackend

__all__ = [
    "BACKENDS",
    "DTensorBackend",
    "ShardingBackend",
    "TorchXlaBackend",
    "agree",
    "agree_on_arguments",
    "backend_for",
    "device_type_of",
    "dtensor_device_mesh",
    "mesh_text",
    "process_count",
    "process_index",
    "spec_text",
    "torch_xla_backend",
    "use_backend",
]
