"""accelerate's ``ParallelismConfig`` in `FSDPTrainer`: the mesh it describes, and each step's inputs
under context parallelism.

``TrainingArguments(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))`` is how the
Trainer is told its parallelisms (accelerate 1.15). FSDPTrainer shards the model itself, so it takes
the config off the arguments before the Trainer builds its Accelerator (which would refuse it on
CPU processes, ``MULTI_CPU``, wrap the model in its own FSDP2, and run torch's CUDA-only ring
attention): the sizes become `mesh.ParallelDims` (``dp_replicate_size`` -> data, ``dp_shard_size``
-> fsdp, ``cp_size`` -> context, ``tp_size`` -> tensor), the mesh is built from them, FSDP shards
over fsdp x context, and `spmd.context_parallel` splits every attention's sequence.

A step's inputs are then prepared as the Trainer prepares them for its own CP
(``_prepare_context_parallel_inputs``): the labels shifted before the split (``shift_labels``: a
shard's last token's label is the next shard's first token), the positions given, the sequence
split, and an attention mask that only marks right padding dropped (a causal query never sees
later tokens, and the padding's labels are ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from fsdp_xla.hf.config import HFConfigError
from mesh import ParallelDims

__all__ = ["causal_lm_loss_by_token", "context_inputs", "keep_token_layout_in_loss", "take_parallelism_config"]

IGNORE_INDEX = -100  # the label the Trainer's losses ignore


def take_parallelism_config(training_args: Any, world: int) -> ParallelDims | None:
    """The arguments' ``parallelism_config`` as `ParallelDims` (and removed from them), or ``None``.

    Raises:
        HFConfigError: sequence parallelism (DeepSpeed's Ulysses) asked for, a CP backend other
            than torch's, or sizes whose product is not the ``world`` of processes or devices.
    """
    config = getattr(training_args, "parallelism_config", None)
    if config is None:
        return None
    if (config.sp_size or 1) > 1:
        raise HFConfigError(
            f"ParallelismConfig(sp_size={config.sp_size}) is DeepSpeed's sequence parallelism (Ulysses), which "
            "FSDPTrainer does not run. Split the sequence with cp_size instead (context parallelism, on both backends)."
        )
    if (config.cp_size or 1) > 1 and config.cp_backend not in (None, "torch"):
        raise HFConfigError(
            f"ParallelismConfig(cp_backend={config.cp_backend!r}): FSDPTrainer runs context parallelism itself "
            "(spmd.context_parallel, MaxText's all_gather strategy). Leave cp_backend out."
        )
    dims = ParallelDims(
        data=config.dp_replicate_size or 1,
        fsdp=config.dp_shard_size or 1,
        context=config.cp_size or 1,
        tensor=config.tp_size or 1,
    )
    if dims.world != world:
        raise HFConfigError(
            f"ParallelismConfig(dp_replicate_size={dims.data}, dp_shard_size={dims.fsdp}, cp_size={dims.context}, "
            f"tp_size={dims.tensor}) covers {dims.world} devices, but there are {world}. Make the sizes multiply to "
            f"{world} (e.g. dp_shard_size={world // (dims.data * dims.context * dims.tensor) or 1})."
        )
    training_args.parallelism_config = None  # accelerate must not act on it as well
    return dims


def _drop_right_padding_mask(inputs: dict[str, Any]) -> None:
    """Remove an ``attention_mask`` that only marks right padding.

    Raises:
        HFConfigError: the mask hides tokens that are not a right-padded tail (left padding,
            packed documents): context parallelism cannot apply it.
    """
    mask = inputs.pop("attention_mask", None)
    if mask is None or not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return
    keep = mask.bool()
    if bool((keep[:, 1:] & ~keep[:, :-1]).any()):  # a token after a masked one: not right padding
        raise HFConfigError(
            "The batch's attention_mask hides tokens before others (left padding or packed sequences), which "
            "context parallelism cannot apply. Pad on the right (tokenizer.padding_side = 'right'), with the "
            "padding's labels -100."
        )


def context_inputs(
    plan: Any, inputs: Mapping[str, Any], gather_rows: Callable[[torch.Tensor], torch.Tensor] | None
) -> dict[str, Any]:
    """``inputs`` (a step's batch as the Trainer gives it) as this process's block under the plan.

    ``gather_rows``: on the dtensor backend, what joins the rows the processes of this process's
    context group were each given (accelerate gives every process its own rows, but a context
    group shares its rows and splits their sequence); ``None`` on torch_xla.
    """
    inputs = dict(inputs)
    _drop_right_padding_mask(inputs)
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise HFConfigError(
            "Context parallelism in FSDPTrainer splits the batch's input_ids [batch, seq]; this batch has "
            f"{type(ids).__name__ if ids is None else tuple(ids.shape)}. Give the model input_ids."
        )
    sequences = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.shape[:2] == ids.shape}
    if gather_rows is not None:
        sequences = {k: gather_rows(v) for k, v in sequences.items()}
    labels = sequences.get("labels")
    if labels is not None and "shift_labels" not in sequences:
        padded = torch.nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)
        sequences["shift_labels"] = padded[:, 1:].contiguous()
    if "position_ids" in sequences:
        raise HFConfigError(
            "The batch has position_ids (packed sequences?): under context parallelism each token's position comes "
            "from the split (ContextParallel.shard_batch). Drop them from the collator; packed documents are not "
            "split by context parallelism."
        )
    inputs.update(plan.shard_batch(sequences, rows="local"))
    return inputs


def causal_lm_loss_by_token(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    vocab_size: int,
    num_items_in_batch: torch.Tensor | int | None = None,
    ignore_index: int = IGNORE_INDEX,
    shift_labels: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' causal-LM loss (``ForCausalLMLoss``: float32 logits, labels shifted unless
    ``shift_labels`` is given, a sum over ``num_items_in_batch`` or else a mean) computed over
    ``[rows, seq]`` as they are, without flattening them to ``[rows x seq]``.

    Under context parallelism on GSPMD the rows are split over the batch axes and the tokens over
    the context axis; flattening the two into one dim is a layout GSPMD cannot give without
    gathering the logits along the sequence (a ``[rows, seq, vocab]`` all-gather every step).
    ``cross_entropy`` over ``[rows, vocab, seq]`` keeps both splits."""
    if logits.dim() != 3:
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs)
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), shift_labels, ignore_index=ignore_index, reduction=reduction
    )
    if reduction == "sum":
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def keep_token_layout_in_loss(model: Any) -> bool:
    """Give ``model`` `causal_lm_loss_by_token` where it would use transformers' default causal-LM
    loss; a loss of the user's own (``model.loss_function = ...``) or of another kind is left as
    it is. Returns whether it was replaced."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    if "_loss_function" in vars(model) or getattr(model, "loss_function", None) is not LOSS_MAPPING["ForCausalLM"]:
        return False
    model.loss_function = causal_lm_loss_by_token
    return True
