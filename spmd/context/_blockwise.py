"""Attention of a few query spans against the whole key sequence, block by block, on any device.

This is the arithmetic of flash attention written with plain torch ops, so that it runs wherever
torch does (CPU with gloo, TorchTPU, GPUs): scores are formed one ``(query block, key block)``
tile at a time with a running maximum and sum (the online softmax), never as a ``[queries,
keys]`` matrix, and backward recomputes each tile from the saved log-sum-exp. Under a causal
mask, key blocks wholly after a query block are skipped, so a shard holding an early and a late
chunk of the sequence (`SequenceOrder`'s load balancing) does the same work as any other.

Queries are given as spans of token positions (``[(start, stop), ...]``, concatenated along the
query dim); keys and values hold positions ``0 .. keys - 1`` in order. Grouped-query attention
(fewer key/value heads) is computed per group, without repeating keys and values.

On the CPU, torch's own flash kernel does the work instead (`torch_compat.cpu_flash_attention`,
2-4x faster than the tiles here, measured at 8K tokens): each span attends its earlier keys with
no mask and its own keys causally, two kernel calls whose outputs merge by their log-sum-exp;
backward gives each call the merged output and log-sum-exp, which makes its gradients exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from spmd._util import torch_compat

__all__ = ["BLOCK", "span_attention"]

BLOCK = 1024  # tokens per tile side: a tile's scores are B x H x BLOCK x BLOCK floats


def _tiles(spans: tuple[tuple[int, int], ...], keys: int, causal: bool, block: int) -> Iterator[tuple]:
    """``(query offset, query start, query stop, key start, key stop)`` for every tile that has a
    visible score: the query dim walks the spans in their order, the key dim ``0 .. keys``."""
    offset = 0
    for start, stop in spans:
        for q0 in range(start, stop, block):
            q1 = min(q0 + block, stop)
            last = min(keys, q1) if causal else keys  # a causal query sees keys up to its own position
            for k0 in range(0, last, block):
                yield offset + q0 - start, q0, q1, k0, min(k0 + block, last)
        offset += stop - start


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: float32, or float64 for float64 inputs (as flash kernels)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q: torch.Tensor, k: torch.Tensor, tile: tuple, causal: bool, scale: float) -> torch.Tensor:
    """One tile's scores (accumulation dtype), ``[B, Hkv, groups, q, k]``; keys after the query masked."""
    _, q0, q1, k0, k1 = tile
    s = torch.einsum("bhgqd,bhkd->bhgqk", _acc(q), _acc(k)) * scale
    if causal and k1 - 1 > q0:  # the tile crosses the diagonal
        qpos = torch.arange(q0, q1, device=s.device)[:, None]
        kpos = torch.arange(k0, k1, device=s.device)[None, :]
        s = s.masked_fill(kpos > qpos, float("-inf"))
    return s


def _grouped(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, L, D]`` queries as ``[B, Hkv, H / Hkv, L, D]``: each key/value head's query group."""
    b, h, length, d = q.shape
    return q.view(b, kv_heads, h // kv_heads, length, d)


def _forward(q, k, v, spans, causal, scale, block):  # noqa: ANN001, ANN202
    """Output and log-sum-exp (float32, ``[B, Hkv, groups, L]``) by the online softmax."""
    qg = _grouped(q, k.shape[1])
    dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.zeros(qg.shape, dtype=dtype, device=q.device)
    row_max = torch.full(qg.shape[:-1], float("-inf"), dtype=dtype, device=q.device)
    row_sum = torch.zeros(qg.shape[:-1], dtype=dtype, device=q.device)
    for tile in _tiles(spans, k.shape[2], causal, block):
        at, q0, q1, k0, k1 = tile
        rows = slice(at, at + q1 - q0)
        s = _scores(qg[..., rows, :], k[:, :, k0:k1], tile, causal, scale)
        new_max = torch.maximum(row_max[..., rows], s.amax(-1))  # finite: a row's first tile holds key 0
        p = torch.exp(s - new_max[..., None])
        keep = torch.exp(row_max[..., rows] - new_max)  # what the row's earlier tiles are worth now
        row_sum[..., rows] = row_sum[..., rows] * keep + p.sum(-1)
        pv = torch.einsum("bhgqk,bhkd->bhgqd", p, _acc(v[:, :, k0:k1]))
        out[..., rows, :] = out[..., rows, :] * keep[..., None] + pv
        row_max[..., rows] = new_max
    out = out / row_sum[..., None]
    return out.reshape(q.shape).to(q.dtype), row_max + row_sum.log()


def _backward(grad_out, q, k, v, out, lse, spans, causal, scale, block):  # noqa: ANN001, ANN202
    kv_heads = k.shape[1]
    qg, dog = _grouped(q, kv_heads), _acc(_grouped(grad_out, kv_heads))
    delta = (dog * _acc(_grouped(out, kv_heads))).sum(-1)
    dtype = delta.dtype
    dq, dk, dv = (torch.zeros(t.shape, dtype=dtype, device=t.device) for t in (qg, k, v))
    for tile in _tiles(spans, k.shape[2], causal, block):
        at, q0, q1, k0, k1 = tile
        rows = slice(at, at + q1 - q0)
        kb, vb = _acc(k[:, :, k0:k1]), _acc(v[:, :, k0:k1])
        p = torch.exp(_scores(qg[..., rows, :], kb, tile, causal, scale) - lse[..., rows, None])
        do = dog[..., rows, :]
        dv[:, :, k0:k1] += torch.einsum("bhgqk,bhgqd->bhkd", p, do)
        ds = p * (torch.einsum("bhgqd,bhkd->bhgqk", do, vb) - delta[..., rows, None]) * scale
        dq[..., rows, :] += torch.einsum("bhgqk,bhkd->bhgqd", ds, kb)
        dk[:, :, k0:k1] += torch.einsum("bhgqk,bhgqd->bhkd", ds, _acc(qg[..., rows, :]))
    return dq.reshape(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _SpanAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q, k, v, spans, causal, scale, block):  # noqa: ANN001, ANN205
        out, lse = _forward(q, k, v, spans, causal, scale, block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (spans, causal, scale, block)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(grad_out.contiguous(), q, k, v, out, lse, *ctx.options)
        return dq, dk, dv, None, None, None, None


def _key_parts(spans: tuple[tuple[int, int], ...], keys: int, causal: bool) -> list[list[tuple[int, int, bool]]]:
    """For each span, the ``(key start, key stop, causal)`` calls that cover what it sees."""
    if not causal:
        return [[(0, keys, False)] for _ in spans]
    return [([(0, start, False)] if start else []) + [(start, stop, True)] for start, stop in spans]


def _by_group(q: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """``q``'s heads as ``groups`` tensors of one head per key/value head each (head ``h`` of a
    grouped-query layer reads key/value head ``h // groups``), so the kernel runs on the keys and
    values as they are: repeated for the query heads they were ``groups`` times the memory."""
    b, h, length, d = q.shape
    return [q.view(b, h // groups, groups, length, d)[:, :, g].contiguous() for g in range(groups)]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The inverse of `_by_group`: per-group results back in head order."""
    stacked = torch.stack(parts, dim=2)  # [B, Hkv, groups, ...]
    return stacked.flatten(1, 2)


def _attend(forward, q, k, v, causal, scale, groups):  # noqa: ANN001, ANN202
    """One kernel call's output (float32) and log-sum-exp of ``q`` against ``k``, ``v``."""
    results = [forward(qg, k, v, 0.0, causal, scale=scale) for qg in _by_group(q, groups)]
    return _joined([o.to(lse.dtype) for o, lse in results]), _joined([lse for _, lse in results])


class _FlashSpanAttention(torch.autograd.Function):
    """`span_attention` by torch's CPU flash kernel (module docstring), one call per query-head
    group of a grouped-query layer, on the keys and values as they are."""

    @staticmethod
    def forward(ctx: Any, q, k, v, spans, causal, scale):  # noqa: ANN001, ANN205
        forward, _ = torch_compat.cpu_flash_attention()
        groups = q.shape[1] // k.shape[1]
        outs, lses, at = [], [], 0
        for (start, stop), parts in zip(spans, _key_parts(spans, k.shape[2], causal)):
            rows, at = slice(at, at + stop - start), at + stop - start
            out = lse = None
            for k0, k1, part_causal in parts:
                keys = slice(k0, k1)
                part, part_lse = _attend(
                    forward, q[:, :, rows], k[:, :, keys], v[:, :, keys], part_causal, scale, groups
                )
                if out is None:
                    out, lse = part, part_lse
                    continue
                merged = torch.logaddexp(lse, part_lse)
                out = out * (lse - merged).exp()[..., None] + part * (part_lse - merged).exp()[..., None]
                lse = merged
            outs.append(out)
            lses.append(lse)
        out, lse = torch.cat(outs, 2).to(q.dtype), torch.cat(lses, 2)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (spans, causal, scale, groups)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out):  # noqa: ANN001, ANN205
        _, backward = torch_compat.cpu_flash_attention()
        q, k, v, out, lse = ctx.saved_tensors
        spans, causal, scale, groups = ctx.options
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        at = 0
        for (start, stop), parts in zip(spans, _key_parts(spans, k.shape[2], causal)):
            rows, at = slice(at, at + stop - start), at + stop - start
            per_group = [_by_group(t[:, :, rows], groups) for t in (grad_out, q, out, lse[..., None])]
            dq_groups = []
            for go, qg, og, lg in zip(*per_group):
                dq_g = torch.zeros_like(qg)
                for k0, k1, part_causal in parts:
                    keys = slice(k0, k1)
                    g = backward(go, qg, k[:, :, keys], v[:, :, keys], og, lg[..., 0], 0.0, part_causal, scale=scale)
                    dq_g += g[0]
                    dk[:, :, keys] += g[1]
                    dv[:, :, keys] += g[2]
                dq_groups.append(dq_g)
            dq[:, :, rows] = _joined(dq_groups)
        return dq, dk, dv, None, None, None


def _flash_applies(q: torch.Tensor) -> bool:
    return q.device.type == "cpu" and torch_compat.cpu_flash_attention() is not None


def span_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: tuple[tuple[int, int], ...],
    *,
    causal: bool,
    scale: float,
    block: int = BLOCK,
    tiles: bool = False,
) -> torch.Tensor:
    """Softmax attention of ``q`` (``[B, H, L, D]``, its ``L`` tokens at the positions ``spans``
    lists) over ``k``, ``v`` (``[B, Hkv, keys, D]``, positions ``0 .. keys - 1``), the same as
    ``scaled_dot_product_attention`` of those rows of the full sequence's queries. On the CPU
    torch's flash kernel computes it (``block`` then unused) unless ``tiles`` is set."""
    if _flash_applies(q) and not tiles:
        return _FlashSpanAttention.apply(q, k, v, spans, causal, scale)
    return _SpanAttention.apply(q, k, v, spans, causal, scale, block)
