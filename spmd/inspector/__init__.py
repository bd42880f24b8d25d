"""The sharding inspector: per-device memory and communication of compiled steps, read from
XLA's own dumps, on virtual CPU devices before a TPU pod is spent; on the DTensor backend, a dry
run of any rank of an N-rank job in one process.

- ``python -m spmd.inspector SCRIPT [ARGS]``: run a script, print a table, write JSON.
- ``python -m spmd.inspector --world N [--rank r | --ranks all|worst] SCRIPT [ARGS]``: the
  script, unmodified, as rank r of N on torch.distributed's fake process group and fake
  tensors: memory by category per step and every collective (docs/inspector.md).
- `capture`: ``with capture() as report: ...; torch_xla.sync()`` in a running process
  (call `prepare` at the top of the script first).
- `read_graph` / `HloModuleText` / `MemoryUsage`: read dumps you already have.
"""

from spmd.hlo import ArrayShape, HloModuleText
from spmd.inspector.capture import Capture, InspectorError, capture
from spmd.inspector.checks import CheckOptions, find_issues
from spmd.inspector.collectives import Collective, CollectiveKind, ring_bytes_sent
from spmd.inspector.dump import list_modules, prepare, read_graph
from spmd.inspector.memory import MemoryUsage
from spmd.inspector.report import (
    Finding,
    GraphReport,
    ParameterInfo,
    Report,
    UnknownGraphError,
    WarningCode,
    format_bytes,
)

__all__ = [
    "ArrayShape",
    "Capture",
    "CheckOptions",
    "Collective",
    "CollectiveKind",
    "Finding",
    "GraphReport",
    "HloModuleText",
    "InspectorError",
    "MemoryUsage",
    "ParameterInfo",
    "Report",
    "UnknownGraphError",
    "WarningCode",
    "capture",
    "find_issues",
    "format_bytes",
    "list_modules",
    "prepare",
    "read_graph",
    "ring_bytes_sent",
]
