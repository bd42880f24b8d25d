"""Work across processes: global tensors and batches from per-process data, the per-process
layout behind them, data loaders that feed each process its rows, process groups with a
heartbeat, and hang reports when a collective times out.

The implementation modules are private; import from here (or from ``spmd``).
"""

from mesh.naming import publish
from spmd.multiprocess._data_loader import DataPosition as DataPosition
from spmd.multiprocess._data_loader import ProcessDataLoader as ProcessDataLoader
from spmd.multiprocess._data_loader import ProcessSampler as ProcessSampler
from spmd.multiprocess._hang_report import watch_collectives as watch_collectives
from spmd.multiprocess._process_data import make_global_batch as make_global_batch
from spmd.multiprocess._process_data import make_global_tensor as make_global_tensor
from spmd.multiprocess._process_data import process_rows as process_rows
from spmd.multiprocess._process_group import init_process_group as init_process_group
from spmd.multiprocess._process_layout import DimSlot as DimSlot
from spmd.multiprocess._process_layout import ProcessLayout as ProcessLayout

__all__ = [
    "DataPosition",
    "DimSlot",
    "ProcessDataLoader",
    "ProcessLayout",
    "ProcessSampler",
    "init_process_group",
    "make_global_batch",
    "make_global_tensor",
    "process_rows",
    "watch_collectives",
]

# Reprs, pickles and docs name the public path, as jax sets NamedSharding.__module__ = "jax.sharding";
# pickles that name the private module still load (the class lives on there);
# `mesh.naming.publish` resolves their annotations first, so typing.get_type_hints still works.
publish(__name__, DataPosition, DimSlot, ProcessDataLoader, ProcessLayout, ProcessSampler)
