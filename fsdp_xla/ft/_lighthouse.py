"""The lighthouse: torchft's server that tracks replica groups by heartbeat and decides, step by
step, which groups train together (the quorum) and who heals whom. One per job, anywhere the
groups can reach; it keeps no training state, so it can restart (the groups retry)."""

from __future__ import annotations

from typing import Any

from fsdp_xla.errors import FaultToleranceError, FSDPError, FSDPTypeError
from fsdp_xla.ft._torchft import torchft_module
from mesh.checks import require_int, require_real, require_str

__all__ = ["Lighthouse"]


class Lighthouse:
    """torchft's lighthouse, served from this process until `shutdown` (or the ``with`` block's end).

    Args:
        min_replicas: the fewest replica groups a quorum may have.
        bind: ``host:port`` to listen on (``[::]:0`` for a free port).
        join_timeout: seconds to wait for a group that heartbeats but has not asked to join the
            step before the quorum goes on without it.
        heartbeat_timeout: seconds without a heartbeat after which a group counts as lost (a
            killed group's peers wait this long before they go on without it).
        quorum_tick: seconds between checks for a quorum.

    Raises:
        FSDPTypeError: an argument of the wrong type.
        FSDPError: ``min_replicas`` < 1 or a time <= 0.
        FaultToleranceError: ``bind`` is not an address this host can listen on (or is in use).
        TorchftNotInstalledError: torchft is not installed.
    """

    def __init__(
        self,
        *,
        min_replicas: int = 1,
        bind: str = "[::]:29510",
        join_timeout: float = 60.0,
        heartbeat_timeout: float = 5.0,
        quorum_tick: float = 0.1,
    ) -> None:
        require_int(min_replicas, "Lighthouse min_replicas", FSDPTypeError, minimum=1, range_error=FSDPError)
        require_str(bind, "Lighthouse bind (host:port)", FSDPTypeError, nonempty=True)
        times = {"join_timeout": join_timeout, "heartbeat_timeout": heartbeat_timeout, "quorum_tick": quorum_tick}
        for name, value in times.items():
            require_real(value, f"Lighthouse {name} (seconds)", FSDPTypeError, positive=True, range_error=FSDPError)
        native = torchft_module("torchft._torchft", feature="the lighthouse")
        try:
            self._server: Any = native.LighthouseServer(
                bind=bind,
                min_replicas=min_replicas,
                join_timeout_ms=int(join_timeout * 1000),
                quorum_tick_ms=int(quorum_tick * 1000),
                heartbeat_timeout_ms=int(heartbeat_timeout * 1000),
            )
        except RuntimeError as e:  # torchft's native server: "Address already in use", "invalid socket address"
            raise FaultToleranceError(
                f"Lighthouse(bind={bind!r}) cannot listen there: {e}. Give a free port as host:port "
                "('[::]:29510'), or '[::]:0' for any free one (the address property then tells the groups)."
            ) from e

    @property
    def address(self) -> str:
        """``http://host:port``: what every replica group's ``ReplicaGroup(lighthouse=...)`` takes."""
        return self._server.address()

    def shutdown(self) -> None:
        self._server.shutdown()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
