"""``--remat``: what each repeated block keeps for backward, as a JAX checkpoint policy named as
MaxText names its ``remat_policy`` values (MaxText ``layers/decoders.py``, ``get_remat_policy``).

A block's projections are named as MaxText names them (`projection_name`: ``query_proj``,
``key_proj``, ``value_proj``, ``qkv_proj``, ``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwi``,
``mlpwo``), by the torch module each comes from (Hugging Face's ``q_proj``, ``gate_proj``,
GPT-2's ``c_attn`` ...), and each policy saves the names MaxText's policy of that name saves:

| policy | keeps for backward | MaxText |
|---|---|---|
| ``none`` | every activation (layout ops are recomputed: transposes, casts, and the gathers) | ``remat_policy=none`` |
| ``dots`` (``minimal``) | q, k, v, out and MLP projections | ``minimal`` |
| ``save_qkv_context`` | q, k and v projections and attention's output (the splash kernel's output and log-sum-exp, ``context``) | ``custom`` with ``query_proj``, ``key_proj``, ``value_proj``, ``context`` (and ``decoder_layer_input``) on ``device`` |
| ``save_dot_except_mlp`` | q, k, v and out projections | ``save_dot_except_mlp`` |
| ``save_qkv_proj`` | q, k and v projections | ``save_qkv_proj`` |
| ``full`` | nothing inside the block: its input only | ``full`` |
| ``offload`` | nothing on the device: the block's input in host memory | ``custom``, ``decoder_layer_input=offload`` |

Every policy also keeps what a scanned, checkpointed block keeps by construction, its input,
except ``offload``, which moves it to the host (``pinned_host``) in forward and back in backward
(MaxText's Llama 3.1 405B recipe on 256 Ironwood chips runs so). ``save_qkv_context`` is the
policy of tpu-recipes' Llama 3.1-70B runs on Ironwood (8k and 128k tokens): with splash attention
it keeps the kernel's residuals, so backward runs no attention forward again, only the output
projection and the MLP's input projections (the MLP's input needs the attention's output added
back); with ``dot`` attention there is no kernel to name, and it keeps what ``save_qkv_proj`` keeps.

No policy keeps a gathered weight: FSDP gathers it again in backward, as our optimization
barriers make GSPMD do (naming the gathered value would not be enough: what torch derives from
it, a transposed weight, would be kept instead), so policies name activations only. A projection
the table does not know (a factory's own module names) is ``dot``, which ``dots`` keeps.
Attention's scores are never kept (the kernel, or ``dots``' recomputation, makes them again).

The estimate's recomputation (`recompute_factor`) counts hardware FLOPs, never model FLOPs.
"""

from __future__ import annotations

import enum
from typing import Any

from spmd.plan.errors import PlanError
from spmd.plan.request.custom_remat import (
    BLOCK_INPUT,
    BLOCK_INPUT_NAME,
    CONTEXT,
    CONTEXT_NAME,
    CUSTOM_PREFIX,
    MLP_OUT,
    NAMES,
    OUT_PROJ,
    CustomRemat,
)

__all__ = [
    "BLOCK_INPUT", "CONTEXT", "PROJECTIONS", "Remat", "as_custom", "host_names", "jax_policy",
    "kernel_residual_name", "projection_name", "recompute_factor",
]  # fmt: skip

# CONTEXT: the splash kernel's residuals (its attention output and log-sum-exp), MaxText's
# ``context``; BLOCK_INPUT: the checkpoint name of a block's input (offloaded by ``offload``).
OTHER_DOT = "dot"  # a block's projection of no known role

# MaxText's names, by what they hold; ``mlpwi`` is a non-gated MLP's input projection (GPT-2).
QKV_NAMES = ("query_proj", "key_proj", "value_proj", "qkv_proj")
MLP_NAMES = ("mlpwi_0", "mlpwi_1", "mlpwi", MLP_OUT)
PROJECTIONS = (*QKV_NAMES, OUT_PROJ, *MLP_NAMES, OTHER_DOT)

# Module names of the projections (the last part of a block's submodule path): Hugging Face
# Llama / Mistral / Qwen2, GPT-2 (Conv1D), GPT-NeoX, Falcon, Mixtral's experts.
_BY_MODULE = {
    "q_proj": "query_proj", "query": "query_proj",
    "k_proj": "key_proj", "key": "key_proj",
    "v_proj": "value_proj", "value": "value_proj",
    "c_attn": "qkv_proj", "qkv_proj": "qkv_proj", "query_key_value": "qkv_proj", "Wqkv": "qkv_proj",
    "o_proj": OUT_PROJ, "out_proj": OUT_PROJ,
    "gate_proj": "mlpwi_0", "w1": "mlpwi_0", "up_proj": "mlpwi_1", "w3": "mlpwi_1",
    "c_fc": "mlpwi", "fc1": "mlpwi", "fc_in": "mlpwi", "dense_h_to_4h": "mlpwi",
    "down_proj": MLP_OUT, "w2": MLP_OUT, "fc2": MLP_OUT, "fc_out": MLP_OUT, "dense_4h_to_h": MLP_OUT,
}  # fmt: skip

# Primitives whose outputs `none` recomputes: layout and dtype changes and sharding constraints.
# A gathered weight reaches a matmul only through these, so none of it is kept.
_LAYOUT_PRIMITIVES = frozenset(
    {
        "broadcast_in_dim",
        "convert_element_type",
        "copy",
        "copy_p",
        "expand_dims",
        "reshape",
        "sharding_constraint",
        "squeeze",
        "transpose",
    }
)


class Remat(enum.Enum):
    """What a block keeps for backward (module docstring), most memory first: least recomputation
    first, but for ``save_qkv_context``, which keeps about what ``save_dot_except_mlp`` keeps
    (attention's output where that keeps the output projection's, as wide in a Llama) and runs
    again the output projection where that runs attention: less from a sequence as long as the
    width on (the advisor tries it first of the two; `spmd.plan.predict.ceiling` on what that means for
    ruling policies out)."""

    NONE = "none"
    DOTS = "dots"
    SAVE_QKV_CONTEXT = "save_qkv_context"
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"
    SAVE_QKV_PROJ = "save_qkv_proj"
    FULL = "full"
    OFFLOAD = "offload"

    @classmethod
    def _missing_(cls, value: object) -> Remat | None:
        return cls.DOTS if value == "minimal" else None  # MaxText's name for `dots`

    @classmethod
    def parse(cls, value: str | Remat | CustomRemat) -> Remat | CustomRemat:
        """A preset by name, or a per-tensor policy ``custom:name=choice,...`` (`spmd.plan.request.custom_remat`)."""
        if isinstance(value, (Remat, CustomRemat)):
            return value
        if isinstance(value, str) and value.startswith(CUSTOM_PREFIX):
            return CustomRemat.parse(value)
        try:
            return cls(value)
        except ValueError:
            raise PlanError(
                f"remat must be one of {[r.value for r in cls]} (or 'minimal', MaxText's name for 'dots'), or "
                f"'custom:' with MaxText's tensor names (custom:decoder_layer_input=offload,query_proj=device), "
                f"got {value!r:.60}."
            ) from None

    @property
    def checkpoints_block(self) -> bool:
        """Keeps only the block's input: ``fsdp_xla``'s gradient checkpointing."""
        return self in (Remat.FULL, Remat.OFFLOAD)

    @property
    def saved_names(self) -> tuple[str, ...] | None:
        """The projection names this policy keeps (``None``: every activation, ``none``)."""
        return _SAVED[self]


_SAVED: dict[Remat, tuple[str, ...] | None] = {
    Remat.NONE: None,
    Remat.DOTS: (*QKV_NAMES, OUT_PROJ, *MLP_NAMES, OTHER_DOT),
    Remat.SAVE_DOT_EXCEPT_MLP: (*QKV_NAMES, OUT_PROJ),
    Remat.SAVE_QKV_PROJ: QKV_NAMES,
    Remat.SAVE_QKV_CONTEXT: (*QKV_NAMES, CONTEXT),
    Remat.FULL: (),
    Remat.OFFLOAD: (),
}


def projection_name(path: str) -> str:
    """MaxText's name for the output of the projection at ``path`` inside a block (``self_attn.q_proj``
    -> ``query_proj``); GPT-2's ``c_proj`` is ``out_proj`` under attention and ``mlpwo`` under the MLP."""
    parent, _, leaf = path.rpartition(".")
    if leaf == "c_proj":
        return OUT_PROJ if "attn" in parent else MLP_OUT
    return _BY_MODULE.get(leaf, OTHER_DOT)


def as_custom(remat: str | Remat | CustomRemat, names: tuple[str, ...] | list[str] = NAMES) -> CustomRemat | None:
    """``remat`` (a preset, its name, or ``custom:...``) as a choice per named tensor, of ``names``
    (MaxText's, `spmd.plan.request.custom_remat.NAMES`; a preset's choice for a tensor a block
    does not produce changes nothing): each name a preset keeps on the device, and ``offload``'s
    block input on the host. ``None`` for ``none``, which keeps every activation (no per-tensor
    policy says that)."""
    policy = Remat.parse(remat)
    if isinstance(policy, CustomRemat):
        return policy
    saved = policy.saved_names
    if saved is None:
        return None
    choices = {CONTEXT_NAME if n == CONTEXT else n: "device" for n in saved}
    if policy is Remat.OFFLOAD:
        choices[BLOCK_INPUT_NAME] = "offload"
    return CustomRemat(tuple((n, choices[n]) for n in NAMES if n in choices and n in names))


def host_names(remat: Remat | CustomRemat) -> tuple[str, ...]:
    """What ``remat`` moves to the host, as the program names it: ``offload``'s block input, or a
    custom policy's ``offload`` choices."""
    if isinstance(remat, CustomRemat):
        return remat.offloaded_names
    return (BLOCK_INPUT,) if remat is Remat.OFFLOAD else ()


def kernel_residual_name(remat: Remat | CustomRemat) -> str | None:
    """The name the splash kernel gives its residuals under ``remat``: `CONTEXT` when the policy
    keeps them (on the device, or the host), else none (an unnamed residual is recomputed, and the
    other policies' programs stay as they were)."""
    return CONTEXT if CONTEXT in (*(remat.saved_names or ()), *host_names(remat)) else None


def _keep_activations(prim: Any, *_: Any, **__: Any) -> bool:
    return prim.name not in _LAYOUT_PRIMITIVES


def jax_policy(remat: Remat | CustomRemat) -> Any:
    """The ``jax.checkpoint`` policy of ``remat``."""
    import jax

    policies = jax.checkpoint_policies
    if isinstance(remat, CustomRemat):
        return policies.save_and_offload_only_these_names(
            names_which_can_be_saved=list(remat.saved_names),
            names_which_can_be_offloaded=list(remat.offloaded_names),
            offload_src="device",
            offload_dst="pinned_host",
        )
    if remat is Remat.NONE:
        return _keep_activations
    if remat is Remat.OFFLOAD:
        return policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[BLOCK_INPUT],
            offload_src="device",
            offload_dst="pinned_host",
        )
    names = remat.saved_names or ()
    return policies.save_only_these_names(*names) if names else policies.nothing_saveable


def recompute_factor(
    remat: Remat | CustomRemat, attention_share: float = 0.0, mlp_share: float = 0.0, out_share: float = 0.0
) -> float:
    """Hardware FLOPs over model FLOPs: a policy runs again in backward the forward of what it
    does not keep (a forward is a third of the step's FLOPs). ``attention_share``, ``mlp_share``,
    ``out_share``: attention's, the MLP's and the output projection's parts of the step's model
    FLOPs; ``full`` and ``offload`` run the whole forward again."""
    if remat is Remat.NONE:
        return 1.0
    if isinstance(remat, CustomRemat):  # backward runs again what no choice keeps, on device or host
        kept = set(remat.kept_names)
        if not kept & set(QKV_NAMES):
            return 4 / 3  # no projection kept: the whole forward again, as `full`
        again = attention_share if CONTEXT_NAME not in kept else 0.0
        again += mlp_share if not kept & set(MLP_NAMES[:3]) else 0.0
        again += out_share if OUT_PROJ not in kept else 0.0
        return 1.0 + again / 3
    if remat.checkpoints_block:
        return 4 / 3
    again = attention_share if remat is not Remat.SAVE_QKV_CONTEXT else 0.0  # it keeps the kernel's residuals
    if remat in (Remat.SAVE_DOT_EXCEPT_MLP, Remat.SAVE_QKV_PROJ, Remat.SAVE_QKV_CONTEXT):
        again += mlp_share
    if remat in (Remat.SAVE_QKV_PROJ, Remat.SAVE_QKV_CONTEXT):
        again += out_share
    return 1.0 + again / 3
