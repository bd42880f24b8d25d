"""Run under torchrun (4 ranks, gloo) by test_trainer_dtensor.py: examples/hf_trainer_fsdp.py's model,
data and the blog's fsdp_config.json through FSDPTrainer on DTensor.

    torchrun --nproc_per_node 4 tests/fsdp_xla/hf/hf_trainer_worker.py OUT_DIR

1. The model is built on meta and wrapped (deferred init) while every host tensor that gets
   written is watched (`Materialized`); then 10 steps, a checkpoint at step 5 and 10,
   ``save_model`` and ``save_pretrained``.
2. A new trainer, built the same way, resumes from checkpoint-5 and trains to step 10.
3. A global batch that does not divide by the ranks is refused.

Rank 0 writes OUT_DIR/results.json. With ``foreign`` after OUT_DIR (a second launch, after the
first): a fresh run of another model pointed at the first run's output directory is refused at
its first checkpoint, before it writes any file of it; rank 0 writes OUT_DIR/foreign.json.
"""

import hashlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from examples.hf_trainer_fsdp import build_trainer, parse_args
from fsdp_xla import CheckpointError
from fsdp_xla.hf import HFConfigError

out = Path(sys.argv[1])
_EMPTY = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}


def _local(t: object) -> torch.Tensor | None:
    t = t._local_tensor if isinstance(t, DTensor) else t
    # Plain host tensors (a storage-less stand-in of deferred init holds no memory), floating
    # point (parameters, not the token ids of the data).
    plain = type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"
    return t if plain and t.is_floating_point() else None


class Materialized(TorchDispatchMode):
    """The largest floating-point host storage anything was written into (an ``empty``
    allocation no op writes to holds no memory: its pages are never touched)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest, self.what = 0, ""

    def _saw(self, t: object, func: object) -> None:
        t = _local(t)
        if t is not None and t.untyped_storage().nbytes() > self.largest:
            self.largest, self.what = t.untyped_storage().nbytes(), f"{func} -> {tuple(t.shape)}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        written = [a for a, arg in zip(args, func._schema.arguments) if arg.alias_info and arg.alias_info.is_write]
        written += [v for k, v in kwargs.items() if k == "out"]
        for t in written + ([] if func in _EMPTY else tree_leaves(result)):
            self._saw(t, func)
        return result


def run(tag: str, *argv: str, resume: str | None = None, watch: bool = False) -> dict:
    args = parse_args(["--steps", "10", "--save-steps", "5", "--output-dir", str(out / tag), *argv])
    watcher = Materialized()
    if watch:
        with watcher:
            trainer = build_trainer(args)
    else:
        trainer = build_trainer(args)
    model = trainer.model
    result = {
        "largest_written_bytes": watcher.largest,
        "largest_written": watcher.what,
        "largest_param_bytes": max(p.numel() * p.element_size() for p in model.parameters()),
        "largest_shard_bytes": max(p.to_local().numel() * p.element_size() for p in model.parameters()),
        "all_dtensor": all(isinstance(p, DTensor) for p in model.parameters()),
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "backend": trainer.backend,
    }
    rows = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].tolist()), with_kwargs=True)
    trainer.train(resume_from_checkpoint=resume)
    hook.remove()
    result["losses"] = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    result["wrapped_type"] = type(trainer.model_wrapped).__name__
    result["model_is_wrapped"] = trainer.model_wrapped is trainer.model
    result["first_rows"] = rows[0] if rows else None
    result["mp_param_dtype"] = str(model._get_fsdp_state()._mp_policy.param_dtype)
    if tag == "train":
        trainer.save_model(str(out / "final"))
        trainer.save_pretrained(str(out / "pretrained"))
    return result


def gathered(value: object) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def foreign_run() -> dict:
    """A fresh run of another model (2 layers, not 4) pointed at the first run's output directory:
    refused at its first checkpoint, with that run's checkpoint-5 byte for byte as it was."""
    checkpoint = out / "train" / "checkpoint-5"
    files = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    before = {str(p.relative_to(checkpoint)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    argv = ["--steps", "5", "--save-steps", "5", "--n-layer", "2", "--output-dir", str(out / "train")]
    trainer = build_trainer(parse_args(argv))  # starts the process group
    dist.barrier()  # every rank hashed the files before any trains
    try:
        trainer.train()
        refusal = None
    except CheckpointError as e:
        refusal = str(e)
    dist.barrier()
    after = {str(p.relative_to(checkpoint)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}
    changed = sorted(name for name in before if after.get(name) != before[name])
    return {"refusal": refusal, "changed": changed, "files": len(before)}


if sys.argv[2:] == ["foreign"]:  # a fresh process: it continues no lineage of the first run's
    foreign = gathered(foreign_run())
    if dist.get_rank() == 0:
        (out / "foreign.json").write_text(json.dumps(foreign))
    dist.destroy_process_group()
    sys.exit(0)
first = run("train", watch=True)
resumed = run("resume", resume=str(out / "train" / "checkpoint-5"))
try:
    run("odd", "--batch", "6")
    refused = "nothing"
except HFConfigError as e:
    refused = str(e)
results = {
    "train": first,
    "resume": resumed,
    "per_rank": gathered(
        {k: first[k] for k in ("largest_written_bytes", "largest_written", "largest_shard_bytes", "first_rows")}
    ),
    "odd_batch": refused,
    "world": dist.get_world_size(),
}
if dist.get_rank() == 0:
    (out / "results.json").write_text(json.dumps(results))
dist.destroy_process_group()
