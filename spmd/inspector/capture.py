"""`capture`: inspect the graphs compiled inside a ``with`` block, in the running process (the
torch_xla backend; its implementation is `spmd.inspector._xla.capture`).

While the block runs, every ``torch_xla.sync()`` is counted as the end of a step, and every
``nn.Module`` call opens a scope named by the module's path (``transformer.h.0.attn``), which
XLA_HLO_DEBUG=1 writes into the HLO so the report can name parameters and collectives. Both
are undone when the block ends.
"""

from spmd.inspector._xla.capture import Capture as Capture
from spmd.inspector._xla.capture import InspectorError as InspectorError
from spmd.inspector._xla.capture import capture as capture

__all__ = ["InspectorError", "Capture", "capture"]
