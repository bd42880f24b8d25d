"""XLA's dump directory: turning dumps on (`prepare`), finding the compiled modules
(`list_modules`), reading one into a `GraphReport` (`read_graph`). The torch_xla backend's; its
implementation is `spmd.inspector._xla.dump`."""

from spmd.inspector._xla.dump import ParameterNamer as ParameterNamer
from spmd.inspector._xla.dump import dump_dir_from_flags as dump_dir_from_flags
from spmd.inspector._xla.dump import list_modules as list_modules
from spmd.inspector._xla.dump import prepare as prepare
from spmd.inspector._xla.dump import read_graph as read_graph

__all__ = ["prepare", "dump_dir_from_flags", "list_modules", "read_graph", "ParameterNamer"]
