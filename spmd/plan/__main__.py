"""``python -m spmd.plan``: plan a model's training step on a TPU topology, or ``--advise``.

    python -m spmd.plan llama3.1-70b --topology tpu7x-128 --seq 8192 --attention flash --remat full
    python -m spmd.plan llama2-7b --topology v5p-128 --mesh fsdp=16,tensor=4 --strategy 2d
    python -m spmd.plan llama3.1-70b --topology tpu7x-512 --seq 131072 --batch 64 --mesh fsdp=64,context=8 --attention flash
    python -m spmd.plan config.json --topology v5e-256 --slices 2 --advise --json advice.json

Prints a table; ``--json`` and ``--plot`` write the report (or the advice) to files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mesh import Role
from spmd._util.atomic_file import atomic_write
from spmd._util.cli_args import finite_float, int_in, output_dir, output_file
from spmd.errors import ShardingError
from spmd.plan.report.plan_report import GIB
from spmd.plan.request.custom_remat import CUSTOM_PREFIX, CustomRemat
from spmd.plan.request.fused_projections import parse_fused
from spmd.plan.request.meshes import ADVISED_STRATEGIES, STRATEGIES
from spmd.plan.request.models import BUILTIN_CONFIGS, MAX_SEQ_LEN
from spmd.plan.request.remat import Remat
from spmd.plan.request.settings import MAX_SCOPED_VMEM_KIB, MOMENT_DTYPES, WEIGHT_DTYPES
from spmd.plan.request.splash_blocks import parse_splash_blocks
from spmd.plan.request.topology import MAX_SLICES
from spmd.plan.request.vocab_tiling import MAX_TILES

_T = TypeVar("_T")

REMATS = tuple(r.value for r in Remat)


def _mesh(text: str) -> dict[str, int] | None:
    if text == "auto":
        return None
    shape: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not name.strip().isidentifier() or not size.isdigit() or len(size) > 6 or int(size) < 1:
            raise argparse.ArgumentTypeError(
                f"--mesh takes 'auto' or name=size pairs like fsdp=32,tensor=4 (sizes 1 or more); got {text[:80]!r}"
            )
        if name.strip() in shape:
            raise argparse.ArgumentTypeError(f"--mesh names axis {name.strip()!r} twice in {text!r}; name each once.")
        shape[name.strip()] = int(size)
    return shape


_POSITIVE = int_in(1, 2**31)


def _ints(text: str) -> list[int]:
    try:
        return [_POSITIVE(v) for v in text.split(",")[:64]]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers like 1,2,4 ({e})") from None


def _flag_type(parse: Callable[[str], _T]) -> Callable[[str], _T]:
    """``parse`` as an argparse type: the `ShardingError` it raises for bad text becomes argparse's
    usage error for the flag, with the same message."""

    def flag_type(text: str) -> _T:
        try:
            return parse(text)
        except ShardingError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return flag_type


def _remat(text: str) -> str:
    if text.strip().startswith(CUSTOM_PREFIX):
        return _flag_type(CustomRemat.parse)(text.strip()).value
    try:
        return Remat(text.strip()).value
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown remat policy {text[:40]!r}; choose from {','.join(REMATS)} (or minimal, MaxText's name for dots)"
        ) from None


def _remats(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",")]
    unknown = [n for n in names if n not in REMATS and n != "minimal"]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown remat policies {unknown[:8]}; choose from {','.join(REMATS)}")
    return [Remat(n).value for n in names]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless it is None or False (those say theirs in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _step_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=f"a built-in ({', '.join(BUILTIN_CONFIGS)}), a config.json, or module:function")
    p.add_argument(
        "--topology", required=True, help="a TPU slice: v4-128, v5e-256, v5p-1024, v6e-64, tpu7x-128, or v5p:4x4x8"
    )
    p.add_argument(
        "--slices",
        type=int_in(1, MAX_SLICES),
        default=1,
        help="slices joined over DCN (a 'data' axis spans them, or the mesh's dcn_ sizes: --mesh dcn_fsdp=2,fsdp=64,tensor=4)",
    )
    p.add_argument(
        "--seq",
        type=int_in(2, MAX_SEQ_LEN),
        default=None,
        help="sequence length (default: 2048, or a shorter learned position table)",
    )
    _precision_flags(p)
    p.add_argument("--attention", choices=("dot", "flash"), default="dot", help="dot, or flash (splash attention)")
    p.add_argument(
        "--vocab-tiling",
        type=int_in(1, MAX_TILES),
        default=1,
        help="compute the loss in this many chunks of tokens, never holding all the logits (MaxText's num_vocab_tiling)",
    )
    p.add_argument(
        "--splash-blocks",
        type=_flag_type(parse_splash_blocks),
        default=None,
        help="with --attention flash, the splash kernel's block sizes by MaxText's sa_block_ names, e.g. "
        "q=1024,kv=1024,q_dkv=512,kv_dkv=2048, or one size for all first (2048,q_dkv=1024), and "
        "use_fused_bwd_kernel=true for the fused backward (default: 512, or the largest of 256, 128 dividing the "
        "sequence)",
    )
    p.add_argument(
        "--fused",
        type=_flag_type(parse_fused),
        default=(),
        help="run sibling projections as one matmul over their stacked weights: qkv (q, k and v; not with grouped "
        "key/value heads), mlp (a gated MLP's two input projections), or qkv,mlp (MaxText's fused_qkv, fused_mlp)",
    )
    p.add_argument(
        "--scoped-vmem-kib",
        type=int_in(1, MAX_SCOPED_VMEM_KIB),
        default=None,
        help="the vector memory (VMEM) one kernel may take, in KiB: libtpu's xla_tpu_scoped_vmem_limit_kib "
        "(MaxText's Trillium recipes give 98304; default libtpu's, 32 MiB on v6e)",
    )
    p.add_argument(
        "--hbm-gib",
        type=finite_float(0, 2**20, open_low=True),
        default=None,
        help="per-device memory budget (default: the device's HBM)",
    )
    p.add_argument("--json", type=output_file, default=None, help="write the report (or advice) as JSON")
    p.add_argument("--plot", type=output_file, default=None, help="write a PNG of per-device memory (or the advice)")


def _precision_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="compute dtype")
    p.add_argument(
        "--moment-dtype",
        choices=MOMENT_DTYPES,
        default="float32",
        help="AdamW's first moment (MaxText's mu_dtype; its Ironwood recipes use bfloat16)",
    )
    p.add_argument(
        "--weight-dtype",
        choices=WEIGHT_DTYPES,
        default="float32",
        help="the stored parameters and AdamW's second moment (MaxText's weight_dtype; its mu_dtype defaults to it: "
        "give --moment-dtype bfloat16 too)",
    )


def _one_plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mesh",
        type=_mesh,
        default=None,
        help="'auto' or axis sizes, e.g. fsdp=32,tensor=4 or fsdp=64,context=8 (context parallelism); across slices "
        "MaxText's dcn_ sizes, e.g. dcn_fsdp=2,fsdp=64,tensor=4 (default: auto)",
    )
    p.add_argument("--strategy", choices=STRATEGIES, default=None, help="the plan to compile (default: fsdp)")
    p.add_argument(
        "--tensor", type=int_in(1, 4096), default=None, help="tensor axis size of the auto 2-D mesh (default: 4)"
    )
    p.add_argument(
        "--batch", type=int_in(1, 2**31), default=None, help="global batch in sequences (default: one per batch shard)"
    )
    p.add_argument(
        "--remat",
        type=_remat,
        default=None,
        help=f"what each layer keeps for backward: {', '.join(REMATS)}, or MaxText's custom policy, a choice "
        "(device, offload, remat) per tensor: custom:decoder_layer_input=offload,query_proj=device,... (default: dots)",
    )


# The advisor's flags: None when not given, so that a plan without --advise can refuse them.
_ADVISE_DEFAULTS = {
    "strategies": ",".join(ADVISED_STRATEGIES), "per_device_batches": [1, 2, 4], "tensors": [2, 4, 8], "datas": [1],
    "contexts": [2, 4, 8], "remats": list(REMATS), "refine": 4,
}  # fmt: skip


def _advise_flags(p: argparse.ArgumentParser) -> None:
    a = p.add_argument_group("advisor (--advise)")
    a.add_argument(
        "--advise", action="store_true", help="search plans, remat policies and batches; rank those that fit"
    )
    a.add_argument(
        "--strategies", default=None, help="strategies to try: fsdp, 2d, dp, cp (default: fsdp,2d,dp; cp needs flash)"
    )
    a.add_argument(
        "--per-device-batches", type=_ints, default=None, help="sequences per batch shard to try (default: 1,2,4)"
    )
    a.add_argument("--tensors", type=_ints, default=None, help="tensor axis sizes to try for 2d (default: 2,4,8)")
    a.add_argument(
        "--datas", type=_ints, default=None, help="data axis sizes within a slice to try for fsdp (HSDP; default: 1)"
    )
    a.add_argument(
        "--contexts", type=_ints, default=None, help="context axis sizes to try for cp (fsdp x context; default: 2,4,8)"
    )
    a.add_argument(
        "--remats", type=_remats, default=None, help="remat policies to try (default: all, least recomputation first)"
    )
    a.add_argument(
        "--refine",
        type=int_in(0, 64),
        default=None,
        help="then search up to N per-tensor remat variants of the winner's policy, MaxText's custom choices one "
        "tensor away (default: 4; 0: presets only)",
    )
    a.add_argument(
        "--jobs",
        type=int_in(1, 64),
        default=None,
        help="compiles at once (default: as many as the cores and free memory allow, ~2.5 GiB each)",
    )
    a.add_argument(
        "--cache", type=output_dir, default=None, help="compile cache directory (default: ~/.cache/xla-spmd/plan)"
    )
    a.add_argument("--no-cache", action="store_true", help="compile everything afresh")
    a.add_argument(
        "--fsdp-config", type=output_file, default=None, help="write the winner's Trainer fsdp_config.json here"
    )


_ADVISE_ONLY = (
    "strategies",
    "per_device_batches",
    "tensors",
    "datas",
    "contexts",
    "remats",
    "refine",
    "jobs",
    "cache",
    "no_cache",
    "fsdp_config",
)
_ONE_PLAN = (
    "strategy",
    "mesh",
    "batch",
    Role.TENSOR.value,
    "remat",
)  # flags of one plan: the --tensor flag is the axis


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse flags the chosen mode does not read: one plan's with --advise, the advisor's without."""
    if args.advise:
        given = [_flag(d) for d in _ONE_PLAN if getattr(args, d) is not None]
        if given:
            p.error(
                f"{', '.join(given)} choose one plan, and --advise tries many: use --strategies, --tensors, "
                "--per-device-batches and --remats to narrow the search, or leave out --advise."
            )
        for dest, value in _ADVISE_DEFAULTS.items():
            if getattr(args, dest) is None:
                setattr(args, dest, value)
        return
    given = [_flag(d) for d in _ADVISE_ONLY if getattr(args, d) not in (None, False)]
    if given:
        p.error(
            f"{', '.join(given)} only {'steer' if len(given) > 1 else 'steers'} the advisor's search, which runs with --advise: add --advise, or leave "
            f"{'them' if len(given) > 1 else 'it'} out to plan one step (--strategy, --mesh, --batch, --remat)."
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spmd.plan",
        formatter_class=_Help,
        description="Compile a training step for a TPU topology with the TPU compiler, on this machine (no TPU), "
        "and report per-device HBM, collectives and a predicted step time and MFU (with the roofline bound beside it).",
    )
    _step_flags(p)
    _one_plan_flags(p)
    _advise_flags(p)
    return p


def _write_json(path: Path | None, data: dict) -> None:
    if path:
        with atomic_write(path) as tmp:
            tmp.write_text(json.dumps(data, indent=2))


def _plan(args: argparse.Namespace, hbm: int | None) -> int:
    from spmd.plan.api import plan

    report = plan(
        args.model, args.topology, strategy=args.strategy or Role.FSDP.value, mesh=args.mesh, global_batch=args.batch,
        seq_len=args.seq, compute_dtype=args.dtype, remat=args.remat or "dots", attention=args.attention,
        slices=args.slices, tensor=4 if args.tensor is None else args.tensor, hbm_bytes=hbm,
        moment_dtype=args.moment_dtype, vocab_tiles=args.vocab_tiling, splash_blocks=args.splash_blocks,
        scoped_vmem_kib=args.scoped_vmem_kib, weight_dtype=args.weight_dtype, fused=args.fused,
    )  # fmt: skip
    print(report.table())
    _write_json(args.json, report.to_dict())
    if args.plot:
        from spmd.plan.report.plot import plot_report

        plot_report(report, args.plot)
    return 0 if report.fits else 1


def _advise(args: argparse.Namespace, hbm: int | None) -> int:
    from spmd.plan.advisor.advisor import advise, default_cache_dir

    advice = advise(
        args.model, args.topology, slices=args.slices, strategies=[s.strip() for s in args.strategies.split(",")],
        per_device_batches=args.per_device_batches, tensors=args.tensors, datas=args.datas, contexts=args.contexts,
        remats=args.remats, refine=args.refine,
        attention=args.attention, seq_len=args.seq, compute_dtype=args.dtype, hbm_bytes=hbm, jobs=args.jobs,
        moment_dtype=args.moment_dtype, vocab_tiles=args.vocab_tiling, splash_blocks=args.splash_blocks,
        scoped_vmem_kib=args.scoped_vmem_kib, weight_dtype=args.weight_dtype, fused=args.fused,
        cache_dir=None if args.no_cache else (args.cache or default_cache_dir()),
    )  # fmt: skip
    print(advice.table(), advice.code(), sep="\n\n")
    config = advice.fsdp_config()
    if config is not None:
        print("\nfsdp_config.json:\n" + json.dumps(config, indent=2))
        if args.fsdp_config:
            with atomic_write(args.fsdp_config) as tmp:
                tmp.write_text(json.dumps(config, indent=2) + "\n")
    elif args.fsdp_config:
        why = (
            "nothing fits"
            if advice.winner is None
            else "the winner is data parallel, which is not FSDP"
            if advice.winner.candidate.strategy == "dp"
            else "the winner splits the sequence over a context axis, which the Trainer does not run"
        )
        print(f"\n{args.fsdp_config} not written: {why}.")
    _write_json(args.json, advice.to_dict())
    if args.plot:
        from spmd.plan.report.plot import plot_advice

        plot_advice(advice, args.plot)
    if advice.interrupted:
        return 130  # the shell's code for Ctrl-C: the table above is partial
    return 0 if advice.winner is not None else 1


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    _check_flags(p, args)
    hbm = None if args.hbm_gib is None else int(args.hbm_gib * GIB)
    try:
        return _advise(args, hbm) if args.advise else _plan(args, hbm)
    except ShardingError as e:  # every planner error: bad input, with what to change
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
