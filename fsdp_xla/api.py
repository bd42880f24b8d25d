"""`FullyShardedDataParallel` (alias `FSDP`): FSDP on GSPMD, applied to a module in place.

``FSDP(model, ...)`` returns ``model`` itself, its class (and each unit's) swapped for a
subclass that also derives from `FullyShardedDataParallel`, as PyTorch's FSDP2
``fully_shard`` does. So ``isinstance(model, GPT2LMHeadModel)`` still holds, attributes such
as ``model.config`` still work, and ``state_dict()`` keys are unchanged. Parameters stay the
same ``nn.Parameter`` objects when they were already on the XLA device (they are resharded in
place); parameters on the host or the meta device are replaced by sharded device parameters,
so build the optimizer after wrapping.
"""

from __future__ import annotations

from fsdp_xla._module import FSDP, FullyShardedDataParallel, OutputSharding, fully_shard

__all__ = ["FullyShardedDataParallel", "FSDP", "OutputSharding", "fully_shard"]
