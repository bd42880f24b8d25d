"""Exceptions for invalid shardings; each a ValueError or TypeError subclass with a fix in its message."""

from __future__ import annotations

from mesh.errors import DeviceCountError, NoMeshError

__all__ = [
    "ShardingError",
    "UnknownAxisError",
    "DuplicateAxisError",
    "SpecRankError",
    "AxisIndexError",
    "PartitionSpecTypeError",
    "NotAnXlaTensorError",
    "ShardingConflictError",
    "SpmdModeError",
    "DeviceCountError",
    "ShardLoadError",
    "SpmdTypeError",
    "HloShardingError",
    "NoMeshError",
    "TorchXlaNotInstalledError",
    "ProcessDataError",
    "IndivisibleBatchError",
    "LocalShapeMismatchError",
    "MissingSpecError",
    "DataPositionError",
    "CollectiveTimeoutError",
    "PeerLostError",
    "PlacementError",
    "PlacementDimError",
    "PartialPlacementError",
    "UnmatchedParameterError",
    "RankDisagreementError",
    "ContextParallelError",
    "SequenceLengthError",
    "UnsupportedAttentionError",
    "MfuError",
    "ProcessGroupError",
]

INSTALL_TORCH_XLA = "pip install 'xla-spmd[xla]' (torch 2.9.0 with torch_xla 2.9.0)"


class ShardingError(ValueError):
    """A (mesh, partition spec, tensor) combination that cannot be sharded."""


class UnknownAxisError(ShardingError):
    """The spec names a mesh axis the mesh does not have."""


class DuplicateAxisError(ShardingError):
    """The spec uses one mesh axis for two tensor dims (or twice in one dim)."""


class SpecRankError(ShardingError):
    """The spec has more entries than the tensor has dims."""


class AxisIndexError(ShardingError):
    """An integer mesh axis in the spec is out of range."""


class SpmdTypeError(TypeError):
    """An argument of the wrong type (the message names the types it takes)."""


class PartitionSpecTypeError(SpmdTypeError):
    """A spec entry is not a mesh axis name, index, tuple of those, or ``None``."""


class NotAnXlaTensorError(SpmdTypeError, RuntimeError):
    """The tensor is not on an XLA device, so it cannot carry an XLA sharding.

    Also a ``RuntimeError``, which torch_xla raises here ("Expected XLA tensor"), so
    ``except RuntimeError`` in scripts written for torch_xla still catches it.
    """


class ShardingConflictError(ShardingError, RuntimeError):
    """The tensor already carries a different (non-replicated) sharding.

    Also a ``RuntimeError``, which torch_xla raises for a conflicting re-mark, so scripts written
    for torch_xla that catch it keep working.
    """


class TorchXlaNotInstalledError(ModuleNotFoundError):
    """A feature of the torch_xla lane (GSPMD on lazy XLA tensors, XLA's dumps, FSDP on GSPMD) was
    used where torch_xla is not installed, as on the current lane. The message names the feature,
    the install line, and the dtensor backend as the way on this torch. A ``ModuleNotFoundError``,
    which a bare ``import torch_xla`` raises here."""


class SpmdModeError(RuntimeError):
    """SPMD mode cannot be turned on any more: tensors were placed on the device without it."""


class ShardLoadError(ShardingError, RuntimeError):
    """Shards given to ``load_local_shards_`` do not fit the tensor.

    Also a ``RuntimeError``, which torch_xla raises here, so ``except RuntimeError`` in scripts
    written for torch_xla still catches it.
    """


class HloShardingError(ShardingError):
    """An HLO sharding text that does not parse, or a sharding that does not fit an array."""


class ProcessDataError(ShardingError):
    """Per-process data that cannot make the global tensor asked for (`make_global_tensor`): the
    message names the process, the local and global shapes, the spec and the mesh."""


class IndivisibleBatchError(ProcessDataError):
    """A dim fed in per-process parts does not split evenly over its devices (a global batch
    that is not a multiple of the devices sharing it)."""


class RankDisagreementError(ValueError):
    """The ranks of a multi-process job called one collective entry point with different
    arguments (a spec, a mesh order, a dtype, a loader's seed or position: one host with a stale
    config). Every rank raises it, with one message naming each field that differs, the value
    each group of ranks passed and the fix; nothing was laid out or sent.

    Attributes:
        call: the entry point (``"mark_sharding"``, ``"make_global_tensor"``, ...).
        fields: ``{field: {value as text: [ranks]}}`` for each field that differs.
    """

    def __init__(self, message: str, call: str = "", fields: dict[str, dict[str, list[int]]] | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.fields = fields or {}


class LocalShapeMismatchError(ProcessDataError, RankDisagreementError):
    """The processes passed data of different shapes (or different keys) for one global tensor,
    and nothing else differs; the message names the ranks and their shapes. A
    `RankDisagreementError` too."""


class MissingSpecError(ProcessDataError):
    """A key of a dict batch has no spec."""


class DataPositionError(ValueError):
    """A saved data position that belongs to another dataset, batch size, seed or order."""


class CollectiveTimeoutError(RuntimeError):
    """A collective did not complete within the process group's timeout: a rank stopped, hung
    or died. The message names the collective, its group and the ranks that did not answer."""


class PeerLostError(CollectiveTimeoutError):
    """A collective did not complete because a connection to a peer was lost (closed or reset
    by the peer, typically because it died or its process group was closed): no timeout
    passed. The message names the collective, its group, the peer as the process group's
    backend names it, and what the heartbeats show (the rank whose heartbeat stopped, or
    whose process ended). A `CollectiveTimeoutError` too: one ``except`` catches every
    collective that could not complete."""


class PlacementError(ShardingError):
    """Placements that do not fit the mesh (one per mesh axis) or are not placements."""


class PlacementDimError(PlacementError, IndexError):
    """A ``Shard(dim)`` beyond the tensor's dims. Also an ``IndexError``, which torch_xla raises."""


class PartialPlacementError(PlacementError, NotImplementedError):
    """A ``Partial()`` placement: a pending reduction has no layout to shard by. Also a
    ``NotImplementedError``, which torch_xla raises."""


class UnmatchedParameterError(ShardingError):
    """A strict plan has no rule for a parameter."""


class ContextParallelError(ShardingError):
    """Context parallelism cannot run as asked (`spmd.context_parallel`); the message says why."""


class SequenceLengthError(ContextParallelError):
    """A sequence that does not split into the context shards' equal chunks."""


class UnsupportedAttentionError(ContextParallelError, NotImplementedError):
    """An attention call the context-parallel strategy cannot compute with the sequence split
    (an explicit mask, dropout); the message names the module. Also a ``NotImplementedError``."""


class MfuError(ValueError):
    """A FLOP count, size, time, chip count or peak that MFU's arithmetic cannot use (`spmd.mfu`):
    negative, zero where it divides, not finite, or a model or chip it has no numbers for. The
    message names the argument and what to give instead."""


class ProcessGroupError(ValueError):
    """`spmd.init_process_group` cannot start the process group as asked: one is already running
    in this process. (A ``ValueError``, as torch's own refusal was.)"""
