"""Published MFU of training runs the planner's estimates go beside (the project's anchors table).

MaxText's figures are measured MFU against the chip's bf16 peak, on the recipes named; the
planner's figure is a roofline bound for the plan it compiled, so the two answer different
questions: how far a tuned JAX run got, and how far this plan could go at best.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PUBLISHED", "Published", "published_for"]


@dataclass(frozen=True)
class Published:
    """One published run: model, TPU chips, MFU, and how it ran."""

    model: str
    chip: str
    chips: int
    mfu: float
    setup: str
    source: str

    def line(self) -> str:
        return f"{self.source}: {self.model} on {self.chips} {self.chip} chips, {self.mfu:.1%} MFU ({self.setup})"


PUBLISHED: tuple[Published, ...] = (
    Published(
        "llama3.1-70b", "TPU7x", 64, 0.523,
        "MaxText, FSDP over 128 devices, per-device batch 2 x 8192 tokens, splash attention, remat saving the "
        "layer input, context and q/k/v projections on device, bf16 first moment",
        "tpu-recipes training/ironwood/llama3.1-70b/8k-bf16-tpu7x-4x4x4",
    ),
    Published(
        "llama3.1-405b", "TPU7x", 256, 0.547,
        "MaxText, pure FSDP over 512 devices, per-device batch 3 x 8192 tokens, splash attention, the layer "
        "input and MLP output offloaded to host, k/v projections kept on device, bf16 first moment",
        "tpu-recipes training/ironwood/llama3.1-405b/8k-bf16-tpu7x-4x8x8",
    ),
    Published("llama3.1-8b", "TPU v6e", 256, 0.455, "MaxText", "maxtext docs/reference/models/tiering.md"),
    Published("llama3.1-70b", "TPU v6e", 256, 0.503, "MaxText", "maxtext docs/reference/models/tiering.md"),
    Published("llama2-70b", "TPU v5p", 256, 0.654, "MaxText on v5p-512", "maxtext docs/reference/models/tiering.md"),
)  # fmt: skip


def published_for(model: str, chip: str, chips: int) -> Published | None:
    """The published run of ``model`` on ``chips`` chips of ``chip`` (a `ChipSpec.name`), if any."""
    return next((p for p in PUBLISHED if (p.model, p.chip, p.chips) == (model, chip, chips)), None)
