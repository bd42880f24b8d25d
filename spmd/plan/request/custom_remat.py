"""``--remat custom:...``: a choice per named tensor, MaxText's ``remat_policy: custom``.

MaxText's tuned recipes name, for each tensor a decoder layer produces, whether backward finds it
on the device, in host memory, or computes it again (``decoder_layer_input: offload``,
``query_proj: device``, ``mlpwo: remat`` ...; MaxText ``configs/base.yml``, ``layers/decoders.py``).
The planner takes the same names and choices:

    --remat custom:decoder_layer_input=offload,query_proj=offload,key_proj=device,value_proj=device

Names: ``decoder_layer_input`` (the block's input), ``context`` (attention's output: the splash
kernel's residuals, `spmd.plan.request.remat.CONTEXT`), and the projections `spmd.plan.request.remat` names
(``query_proj``, ``key_proj``, ``value_proj``, ``qkv_proj``, ``out_proj``, ``mlpwi_0``,
``mlpwi_1``, ``mlpwi``, ``mlpwo``). Choices: ``device`` (kept in HBM), ``offload`` (moved to the
host's pinned memory in forward and back in backward), ``remat`` (computed again; every name
not given is). The block's input is the layer scan's carry, which a checkpointed block keeps by
construction: ``device`` and ``remat`` both keep it on the device (as MaxText's scanned layers
do), ``offload`` moves it. The six named policies stay as presets (``offload`` is
``custom:decoder_layer_input=offload``; ``save_qkv_context`` keeps ``context`` and q, k, v).
"""

from __future__ import annotations

from dataclasses import dataclass

from spmd.plan.errors import PlanError

__all__ = [
    "BLOCK_INPUT",
    "BLOCK_INPUT_NAME",
    "CONTEXT",
    "CHOICES",
    "CONTEXT_NAME",
    "CUSTOM_PREFIX",
    "MLP_INPUTS",
    "MLP_OUT",
    "NAMES",
    "OUT_PROJ",
    "QKV",
    "CustomRemat",
]

CUSTOM_PREFIX = "custom:"
# The checkpoint names the program gives MaxText's `context` (the splash kernel's residuals, spelled
# apart from the mesh's context axis) and `decoder_layer_input` (`spmd.plan.request.remat` re-exports them).
CONTEXT = "attention_context"
BLOCK_INPUT = "xla_spmd_block_input"
CHOICES = ("device", "offload", "remat")
BLOCK_INPUT_NAME = "decoder_layer_input"
# MaxText's names the planner's blocks produce; `context` and the block input are spelled apart
# in the program (`spmd.plan.request.remat.CONTEXT`, `BLOCK_INPUT`), the projections as MaxText spells them.
# MaxText's tensor name `context` (attention's output) is spelled as the mesh role `context` is;
# it is no mesh axis, and is read from this one list (mesh role names are literals only in
# mesh/roles.py, tests/mesh/test_roles.py).
NAMES = tuple(
    f"{BLOCK_INPUT_NAME} context query_proj key_proj value_proj qkv_proj out_proj mlpwi_0 mlpwi_1 mlpwi mlpwo".split()
)
CONTEXT_NAME = NAMES[1]
QKV = NAMES[2:6]
OUT_PROJ = NAMES[6]  # attention's output projection, summed onto the residual stream
MLP_INPUTS = NAMES[7:10]
MLP_OUT = NAMES[10]  # the MLP's output projection, summed onto the stream (backward never reads it)


@dataclass(frozen=True)
class CustomRemat:
    """A choice per named tensor (module docstring); ``choices`` in `NAMES` order, ``remat`` left out.

    It answers what `spmd.plan.request.remat.Remat` members answer (``value``, ``saved_names``,
    ``checkpoints_block``), so the step, the memory math and the estimate take either.
    """

    choices: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str) -> CustomRemat:
        """``custom:name=choice,...`` (`PlanError` naming what is wrong)."""
        body = text[len(CUSTOM_PREFIX) :] if text.startswith(CUSTOM_PREFIX) else None
        if not body:
            raise PlanError(
                f"A custom remat policy is 'custom:' and name=choice pairs, e.g. "
                f"custom:decoder_layer_input=offload,query_proj=device; got {text!r:.80}."
            )
        given: dict[str, str] = {}
        for part in body.split(","):
            name, _, choice = (s.strip() for s in part.partition("="))
            if name not in NAMES:
                raise PlanError(
                    f"remat custom: unknown tensor {name!r:.40}; MaxText's names the planner knows: {NAMES}."
                )
            if choice not in CHOICES:
                raise PlanError(f"remat custom: {name}={choice!r:.40}; choose one of {CHOICES}.")
            if name in given:
                raise PlanError(f"remat custom: {name} is given twice ({given[name]} and {choice}); give it once.")
            given[name] = choice
        return cls(tuple((n, given[n]) for n in NAMES if given.get(n, "remat") != "remat"))

    def names(self, choice: str) -> tuple[str, ...]:
        """MaxText's names given ``choice``."""
        return tuple(n for n, c in self.choices if c == choice)

    @property
    def value(self) -> str:
        """The policy as ``--remat`` takes it, in a canonical order (``custom:`` alone keeps nothing but the input)."""
        return CUSTOM_PREFIX + ",".join(f"{n}={c}" for n, c in self.choices)

    @property
    def saved_names(self) -> tuple[str, ...]:
        """The projections and ``context`` kept on the device, as the program names them."""
        return tuple(_program_name(n) for n in self.names("device") if n != BLOCK_INPUT_NAME)

    @property
    def offloaded_names(self) -> tuple[str, ...]:
        """What moves to the host, as the program names it (the block's input included)."""
        return tuple(_program_name(n) for n in self.names("offload"))

    @property
    def kept_names(self) -> tuple[str, ...]:
        """MaxText's names backward does not compute again (on the device or the host)."""
        return tuple(n for n, _ in self.choices)

    @property
    def checkpoints_block(self) -> bool:
        """Keeps nothing inside the block on the device: the block's input alone (``full``, ``offload``)."""
        return not self.saved_names


def _program_name(name: str) -> str:
    return {BLOCK_INPUT_NAME: BLOCK_INPUT, CONTEXT_NAME: CONTEXT}.get(name, name)
