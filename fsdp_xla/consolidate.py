"""``python -m fsdp_xla.consolidate CKPT --output model.safetensors``: merge a sharded
checkpoint into one full state dict (safetensors, or a torch ``.pt`` file), written atomically."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from fsdp_xla.checkpoint import LATEST, consolidate, is_version_name
from fsdp_xla.errors import CheckpointError
from spmd.files import atomic_write, output_dir, output_file

__all__ = ["build_parser", "main", "write_state_dict"]


def write_state_dict(state: dict[str, torch.Tensor], output: str | os.PathLike[str]) -> Path:
    """Write ``state`` to ``output`` (``.safetensors`` or ``.pt``/``.bin``) via a temp file and a
    rename, so a crash never leaves a half-written file under that name."""
    target = Path(output)
    with atomic_write(target) as tmp:
        if target.suffix == ".safetensors":
            from safetensors.torch import save_file

            # safetensors refuses tensors sharing storage (tied weights): store copies.
            seen: dict[int, str] = {}
            unique = {}
            for k, v in state.items():
                unique[k] = v.clone() if id(v) in seen else v.contiguous()
                seen[id(v)] = k
            save_file(unique, str(tmp), metadata={"format": "pt"})
        else:
            torch.save(state, tmp)
    return target


def _output(text: str) -> Path:
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a file path ending in .safetensors, .pt or .bin")
    path = output_file(text)
    if path.suffix not in (".safetensors", ".pt", ".bin"):
        raise argparse.ArgumentTypeError(f"{text[:200]} does not end in .safetensors, .pt or .bin")
    return path


def _owned_by_checkpoint(checkpoint: Path, output: Path) -> str | None:
    """The part of ``checkpoint`` (LATEST, its lock, a version) that ``output`` is or is inside, or None."""
    root, target = checkpoint.resolve(), output.resolve()
    if not target.is_relative_to(root) or target == root:
        return None
    first = target.relative_to(root).parts[0]
    if first in (LATEST, ".lock") or is_version_name(first.removeprefix(".").removesuffix(".partial")):
        return first
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fsdp_xla.consolidate", description=__doc__)
    parser.add_argument("checkpoint", type=output_dir, help="the sharded checkpoint directory (the one holding LATEST)")
    parser.add_argument("--output", "-o", type=_output, required=True, help="output file: .safetensors, or .pt/.bin")
    parser.add_argument("--optimizer", action="store_true", help="include optimizer state (optim/<param>/<field>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    owned = _owned_by_checkpoint(args.checkpoint, args.output)
    if owned:
        parser.error(
            f"argument --output/-o: {args.output} is inside {owned} of the checkpoint being read; write it elsewhere"
        )
    try:
        state = consolidate(args.checkpoint, optimizer=args.optimizer)
    except CheckpointError as e:
        print(f"fsdp_xla.consolidate: {e}", file=sys.stderr)
        return 1
    try:
        path = write_state_dict(state, args.output)
    except OSError as e:
        print(
            f"fsdp_xla.consolidate: cannot write {args.output}: {e.strerror or e}. Nothing was written.",
            file=sys.stderr,
        )
        return 1
    total = sum(t.numel() for t in state.values())
    print(f"wrote {len(state)} tensors ({total:,} elements) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
