"""Ranks agree on what they are about to do before a collective, or every rank raises the same
`RankDisagreementError`.

A collective entry point (`mark_sharding` on DTensor, `make_global_tensor`, a loader's epoch,
a checkpoint save) builds a fingerprint: named fields, each a short text (the spec, the mesh's
shape and device order, the dtype, the global shape, a loader's seed and position...). `agree`
hashes each field into one slot of a fixed-size tuple of ints and exchanges it in one small
collective. The size never depends on the call, so ranks that disagree even on which call they
are in still meet in a collective of one size: gloo aborts the process (``EnforceNotMet``) when
the sizes of one all_gather differ, and DTensor hangs or lays data out inconsistently when the
arguments do. Only when the hashes differ do the ranks exchange the texts (a second collective,
every rank takes it since every rank saw the same hashes) and every rank raises the same error,
built from the same gathered values. torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks
collectives' shapes the same way, one collective ahead; this checks what the user passed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from mesh import as_mesh, get_global_mesh
from spmd._util.ranks import ranks_text
from spmd.errors import LocalShapeMismatchError, RankDisagreementError
from spmd.sharding import PartitionSpec, is_placements

__all__ = [
    "SAME_SHARDING",
    "SLOTS",
    "agree",
    "agree_on_arguments",
    "agree_on_sharding",
    "digest",
    "mesh_text",
    "process_count",
    "ranks_text",
    "sharding_fields",
    "spec_text",
]

T = TypeVar("T")
SLOTS = 16  # ints exchanged per check: the call, then one per field (the rest share the last)
_SHOWN = 160  # characters of a value in a message (around the first difference)
_SENT = 20_000  # characters of a value exchanged once the ranks are known to differ


def process_count(backend: Any) -> int:
    """The backend's process count; 1 where ``torch.distributed`` was never started on the
    dtensor backend (nothing to agree with)."""
    if backend.name == "dtensor":
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return backend.process_count()


def mesh_text(mesh: object) -> str:
    """A mesh's axes and device order (``None``: the global mesh, or that there is none); what
    cannot be read as a mesh, as its repr (its own error comes after the ranks agree)."""
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            return "None (no global mesh)"
    try:
        ours = as_mesh(mesh, "")
    except Exception:  # the call's own check names what is wrong, once the ranks agree on it
        return repr(mesh)
    return f"{ours.describe()} ids {ours.device_ids.tolist()}"


def spec_text(spec: object) -> str:
    """A spec as `PartitionSpec` shows it (``('x',)`` and ``P('x')`` agree), placements as
    DTensor shows them, anything else as its repr."""
    if is_placements(spec):
        return "[" + ", ".join(str(p) for p in spec) + "]"  # type: ignore[attr-defined]
    try:
        return repr(PartitionSpec.from_value(spec))
    except Exception:  # refused by the call's own check once the ranks agree on it
        return repr(spec)


SAME_SHARDING = (
    "Pass the same mesh (shape and device order), spec, dtype and global shape on every rank: one rank runs a "
    "stale config, or feeds a last short batch? Per-process rows go through spmd.make_global_tensor."
)


def agree_on_sharding(backend: Any, call: str, t: object, mesh: object, spec: object, **more: object) -> None:
    """`agree` on `sharding_fields` (and ``more``) where the backend lays data out by
    collectives (DTensor); torch_xla's sharding is an annotation, and there is nothing to send.
    Ranks that differ only in the shape raise `LocalShapeMismatchError`, as before."""
    if backend.name == "dtensor":
        fields = {**sharding_fields(t, mesh, spec), **more}
        agree(backend, call, fields, SAME_SHARDING, {"shape": LocalShapeMismatchError})


def sharding_fields(t: object, mesh: object, spec: object) -> dict[str, str]:
    """The fields every rank must pass alike to lay a tensor out: mesh, spec, and the tensor's
    dtype, global shape and layout (a DTensor's placements)."""
    fields = {"mesh": mesh_text(mesh), "spec": spec_text(spec)}
    shape, dtype = getattr(t, "shape", None), getattr(t, "dtype", None)
    fields["dtype"] = str(dtype).removeprefix("torch.")
    fields["shape"] = str(tuple(shape)) if shape is not None else type(t).__name__
    placements = getattr(t, "placements", None)
    fields["layout"] = "plain tensor" if placements is None else spec_text(tuple(placements))
    return fields


def _hash(text: str) -> int:
    # 62 bits: positive in an int64 tensor on every backend, and no two texts of a real call collide.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 2


def digest(call: str, fields: Mapping[str, str]) -> tuple[int, ...]:
    """``SLOTS`` ints: the call and the field names, then each field's text (fields past the
    last slot share it)."""
    names = list(fields)
    slots = [_hash(call + "\0" + "\0".join(names))]
    head, tail = names[: SLOTS - 2], names[SLOTS - 2 :]
    slots += [_hash(fields[n]) for n in head]
    if tail:
        slots.append(_hash("\0".join(fields[n] for n in tail)))
    return tuple(slots + [0] * (SLOTS - len(slots)))


def agree(
    backend: Any, call: str, fields: Mapping[str, object], fix: str, kinds: Mapping[str, type] | None = None
) -> None:
    """Check that every process passed the same ``fields`` to ``call`` (a collective every
    process makes; nothing with one process). ``fields`` values are shown as ``str`` (a value
    of another type as its ``repr``); ``fix`` ends the message ("pass the same spec on every
    rank"). ``kinds``: a subclass of `RankDisagreementError` to raise when only that field
    differs (``{"shape": LocalShapeMismatchError}``, which callers caught before).

    Raises:
        RankDisagreementError: on every process alike, naming each field that differs.
    """
    if process_count(backend) == 1:
        return
    texts = {name: value if isinstance(value, str) else repr(value) for name, value in fields.items()}
    mine = digest(call, texts)
    every = backend.all_process_values(mine, same_length=True)
    if all(values == every[0] for values in every):
        return
    shown = [[call, {name: text[:_SENT] for name, text in texts.items()}]]
    gathered = backend.all_process_values(tuple(json.dumps(shown).encode()))
    calls = [json.loads(bytes(values).decode())[0] for values in gathered]
    error = _error(call, calls, every, fix)
    kind = {(kinds or {}).get(name, RankDisagreementError) for name in error.fields}
    if len(kind) == 1 and kind != {RankDisagreementError}:
        raise kind.pop()(str(error), error.call, error.fields)
    raise error


def agree_on_arguments(
    backend: Any,
    call: str,
    fields: Mapping[str, object],
    check: Callable[[], T],
    fix: str,
    described: Callable[[T], Mapping[str, object]] | None = None,
) -> T:
    """``check()`` (the call's own checks of its arguments, before its first collective), then
    `agree` on ``fields`` and on whether ``check`` passed; returns what ``check`` returned.
    ``described(result)``: more fields, read from what ``check`` returned (the checked options,
    the model they apply to), agreed in the same exchange when every rank's check passed.

    A rank whose check refused still takes part in the exchange: alone, it would raise at once
    while the others went on to their next collective and failed there only after the process
    group's timeout, with a raw error. So a refusal on one rank reaches every rank at once, as
    the same `RankDisagreementError` naming it; refused alike on every rank, each rank raises
    the check's own error.

    Raises:
        RankDisagreementError: the ranks differ in ``fields``, in what ``described`` gives, or in
            whether ``check`` passed.
        Exception: what ``check`` raised, when every rank refused alike.
    """
    try:
        result = check()
    except Exception as refused:
        agree(backend, call, {"arguments": f"refused ({type(refused).__name__}: {refused})", **fields}, fix)
        raise
    more = described(result) if described is not None else {}
    agree(backend, call, {"arguments": "accepted", **fields, **more}, fix)
    return result


def _error(call: str, calls: list[list], digests: list[tuple[int, ...]], fix: str) -> RankDisagreementError:
    """The one error every rank raises, from the values every rank gathered."""
    names = {c for c, _ in calls}
    if len(names) > 1:
        groups = _groups([c for c, _ in calls])
        text = (  # no call of its own first: every rank raises this one message
            f"The ranks are in different collective calls: {_listing(groups)}. Every rank must make the same calls "
            "in the same order (a branch on the rank, or an exception caught on one rank that skipped a call?)."
        )
        return RankDisagreementError(text, " / ".join(groups), {"call": groups})
    differing: dict[str, dict[str, list[int]]] = {}
    notes: dict[str, str] = {}
    for slot, name in enumerate(list(calls[0][1])[: SLOTS - 2], start=1):
        if len({d[slot] for d in digests}) > 1:
            values = [fields.get(name, "(absent)") for _, fields in calls]  # a rank may send other fields
            differing[name], notes[name] = _groups(values), _how_they_differ(values)
    if not differing:  # past the last slot, or the field names differ: show every field that differs
        for name in calls[0][1]:
            values = [fields.get(name, "(absent)") for _, fields in calls]
            if len(set(values)) > 1:
                differing[name], notes[name] = _groups(values), _how_they_differ(values)
    parts = [f"{name}: {notes[name]}{_listing(groups)}" for name, groups in differing.items()]
    text = "; ".join(parts) if parts else "their arguments differ beyond what a message shows"
    return RankDisagreementError(f"{call}: the ranks passed different arguments, {text}. {fix}", call, differing)


def _how_they_differ(values: list[str]) -> str:
    """What a reader could not see in the values shown: that they differ only past what was
    exchanged (their digests differ, their first `_SENT` characters do not), or only in the
    order of their entries (a module's parameters registered in another order)."""
    if len(set(values)) == 1:
        return f"(equal in their first {_SENT:,} characters, different after them) "
    entries = [sorted(v.split(", ")) for v in values]
    if len(values[0].split(", ")) > 1 and all(e == entries[0] for e in entries):
        return "(the same entries in another order) "
    return ""


def _groups(values: list[str]) -> dict[str, list[int]]:
    """``{value: ranks holding it}``, the fewest ranks first (the odd one out leads); a long
    value shown around where the values first differ (a module's parameter list)."""
    groups: dict[str, list[int]] = {}
    start = max(0, len(_common_prefix(sorted(set(values)))) - 40)
    for rank, value in enumerate(values):
        shown = value[start : start + _SHOWN]
        shown = ("..." if start else "") + shown + ("..." if start + _SHOWN < len(value) else "")
        groups.setdefault(shown, []).append(rank)
    return dict(sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0])))


def _common_prefix(values: list[str]) -> str:
    first, last = values[0], values[-1]  # sorted: the prefix of the two ends is everyone's
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def _listing(groups: dict[str, list[int]]) -> str:
    return ", ".join(f"{ranks_text(ranks)} {value}" for value, ranks in groups.items())
