"""What a replacement replica group receives from a live peer: each rank's own shards of the
model and of the optimizer state, as plain tensors.

Rank ``k`` of every replica group holds the same shards (the groups are copies of one another),
and torchft sends a checkpoint rank to rank (rank ``k`` of the replacement fetches from rank
``k`` of the peer, over torchft's checkpoint transport, HTTP by default). So each rank sends its
DTensors' local tensors and the receiver copies them into its own DTensors of the same layout:
no DeviceMesh crosses the wire (a pickled DTensor would carry the sender's mesh and process
groups) and nothing is gathered.

The peer's side runs on torchft's quorum thread while the main thread runs the step's forward.
``model.state_dict()`` cannot run then: FSDP2's state-dict hook swaps the sharded parameters
back into the modules (measured: the forward then met a sharded weight, "got mixed torch.Tensor
and DTensor"), and during a forward ``named_parameters()`` yields the gathered copies. So
`ShardState` takes the sharded parameters once, when it is built after FSDP and before training,
and reads those objects only. Nothing writes them until the optimizer step, which torchft holds
back until the transfer is over (``should_commit`` closes the checkpoint first).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ShardState"]


def _local(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


class ShardState:
    """This rank's shards of an FSDP ``model`` and its ``optimizer``, to send (`state_dict`) and to
    receive from the same rank of another group (`load_state_dict`). Build it after FSDP, outside
    a step."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self._tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        self._optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        """Local tensors of the shards (views, not copies) and of the optimizer state, and which
        optimizer state entries were DTensors."""
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            state: dict[str, Any] = {"model": {k: _local(v).detach() for k, v in self._tensors.items()}}
            if self._optimizer is not None:
                full = self._optimizer.state_dict()
                entries = full["state"].items()
                sharded = [[i, k] for i, entry in entries for k, v in entry.items() if isinstance(v, DTensor)]
                full["state"] = {i: {k: _local(v) for k, v in entry.items()} for i, entry in entries}
                state["optimizer"] = {"state_dict": full, "sharded": sharded}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy a peer rank's `state_dict` into this rank's shards and optimizer, in place."""
        with torch.no_grad():
            for name, local in state["model"].items():
                _local(self._tensors[name]).copy_(local)
        if self._optimizer is not None and "optimizer" in state:
            self._optimizer.load_state_dict(self._as_dtensors(state["optimizer"]))

    def _as_dtensors(self, sent: dict[str, Any]) -> dict[str, Any]:
        """The peer's optimizer state_dict with each local tensor that was a DTensor made one
        again, laid out as its parameter (optimizer state has the parameter's shape)."""
        from torch.distributed.tensor import DTensor

        full = sent["state_dict"]
        params = [p for group in self._optimizer.param_groups for p in group["params"]]
        for index, key in sent["sharded"]:
            p = params[int(index)]
            local = full["state"][index][key]
            full["state"][index][key] = DTensor.from_local(
                local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
        return full
