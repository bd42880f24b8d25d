"""`SequenceOrder`: which tokens of a sequence each context shard holds, and in what order.

With load balancing (MaxText's ``context_parallel_load_balance``, torch's head-tail balancer) the
sequence is cut into ``2 x shards`` equal chunks and shard ``r`` holds chunks ``r`` and
``2 x shards - 1 - r``: under a causal mask the early chunks attend to few keys and the late ones
to many, so pairing them gives every shard the same work. Without it, shard ``r`` holds the
``r``-th contiguous ``1 / context`` of the sequence. Either way the sequence is first permuted into
the order the shards hold it (`indices`), then split contiguously; `restore` undoes the permutation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from mesh.checks import require_bool, require_int
from spmd.errors import SequenceLengthError, SpmdTypeError

__all__ = ["SequenceOrder"]


@dataclass(frozen=True)
class SequenceOrder:
    """The order of a ``seq_len``-token sequence split over ``shards`` context shards.

    Example:
        >>> order = SequenceOrder(8, 2)
        >>> order.indices.tolist()
        [0, 1, 6, 7, 2, 3, 4, 5]
        >>> order.positions(1).tolist()
        [2, 3, 4, 5]
        >>> SequenceOrder(8, 2, load_balance=False).positions(1).tolist()
        [4, 5, 6, 7]

    Raises:
        SequenceLengthError: ``seq_len`` does not divide into the shards' chunks (``2 x shards``
            of them with load balancing, ``shards`` without).
        SpmdTypeError: a length or size that is not an int, a flag that is not a bool.
    """

    seq_len: int
    shards: int
    load_balance: bool = True

    def __post_init__(self) -> None:
        require_int(self.seq_len, "context parallelism's sequence length", SpmdTypeError, minimum=1)
        require_int(self.shards, "context parallelism's context size", SpmdTypeError, minimum=1)
        require_bool(self.load_balance, "context parallelism's load_balance", SpmdTypeError)
        object.__setattr__(self, "seq_len", int(self.seq_len))
        object.__setattr__(self, "shards", int(self.shards))
        if self.seq_len % self.chunks:
            why = "2 x context, for load balancing" if self.chunks > self.shards else "one per shard"
            multiple = self.chunks * -(-self.seq_len // self.chunks)
            raise SequenceLengthError(
                f"A sequence of {self.seq_len} tokens cannot be split over {self.shards} context shards: it must "
                f"divide into {self.chunks} equal chunks ({why}). Pad it to a multiple of {self.chunks} (e.g. "
                f"{multiple}, the padding's labels ignored), or use another context size."
            )

    @property
    def chunks(self) -> int:
        """How many equal chunks the sequence is cut into."""
        return 2 * self.shards if self.load_balance and self.shards > 1 else self.shards

    @property
    def shard_len(self) -> int:
        """Tokens per shard."""
        return self.seq_len // self.shards

    @cached_property
    def indices(self) -> torch.Tensor:
        """The permutation into shard order: ``x[..., indices]`` is laid out shard after shard."""
        positions = torch.arange(self.seq_len)
        if self.chunks == self.shards:
            return positions
        chunks = positions.view(self.chunks, -1)
        heads = torch.arange(self.shards)
        return torch.stack([chunks[heads], chunks[self.chunks - 1 - heads]], dim=1).reshape(-1)

    @cached_property
    def restore(self) -> torch.Tensor:
        """The inverse permutation: ``reordered[..., restore]`` is in token order again."""
        return torch.argsort(self.indices)

    def positions(self, shard: int) -> torch.Tensor:
        """The token positions shard ``shard`` holds, in the order it holds them."""
        return self.indices[shard * self.shard_len : (shard + 1) * self.shard_len]

    def spans(self, shard: int) -> tuple[tuple[int, int], ...]:
        """The contiguous ``(start, stop)`` token ranges shard ``shard`` holds, in its order."""
        size = self.seq_len // self.chunks
        ids = (shard, self.chunks - 1 - shard) if self.chunks > self.shards else (shard,)
        return tuple((i * size, (i + 1) * size) for i in ids)
