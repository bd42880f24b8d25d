"""Run under torchrun (4 ranks, gloo) by tests/spmd/context/test_context_dtensor.py: context
parallelism's attention on the dtensor backend against the whole sequence's, and its refusals.

    torchrun --nproc_per_node 4 tests/workers/context_worker.py OUT_DIR

Each rank writes OUT_DIR/rank{r}.json: for each case the largest difference from the
reference (output, and the gradients of queries, keys and values), or the error it raised.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import spmd
from mesh import ParallelDims

out = Path(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()


class Attention(torch.nn.Module):
    def __init__(self, causal=True, mask=None):
        super().__init__()
        self.causal, self.mask = causal, mask

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, enable_gqa=True)


class Wrapper(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args)


def as_batch(t):
    """[B, H, S, D] as the [B, S, H, D] batch shard_batch splits along dim 1."""
    return t.detach().transpose(1, 2)


def compare(dims, load_balance, causal, heads=4, kv_heads=2, seq=32):
    torch.manual_seed(0)  # every rank draws the same whole tensors
    q = torch.randn(4, heads, seq, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(4, kv_heads, seq, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(4, kv_heads, seq, 8, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(4, heads, seq, 8, dtype=torch.float64)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    expected = torch.autograd.grad((reference * upstream).sum(), (q, k, v))
    model = Wrapper(Attention(causal))
    cp = spmd.context_parallel(model, dims.mesh(), load_balance=load_balance)
    mine = lambda t: cp.shard_batch(as_batch(t)).transpose(1, 2)  # noqa: E731
    local = [mine(t).contiguous().requires_grad_(True) for t in (q, k, v)]
    got = model(*local)
    grads = torch.autograd.grad((got * mine(upstream)).sum(), local)
    errors = [(got - mine(reference)).abs().max().item()]
    errors += [(g - mine(e)).abs().max().item() for g, e in zip(grads, expected)]
    whole = cp.unshard(got.transpose(1, 2)).transpose(1, 2)  # every context shard's tokens, in order
    rows = cp.shard_batch(torch.arange(4.0)[:, None].expand(4, seq)).squeeze(-1)[:, 0].long()
    errors.append((whole - reference[rows]).abs().max().item())
    cp.remove()
    plain = model(*local)  # removed: plain attention of the local tokens again
    errors.append(int(plain.shape == got.shape))
    return errors


def refusal(call):
    try:
        call()
    except Exception as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"error": None, "message": ""}


record = {}
for name, dims in {"context 4": ParallelDims(context=4), "fsdp 2 x context 2": ParallelDims(fsdp=2, context=2)}.items():
    for lb in (True, False):
        for causal in (True, False):
            record[f"{name}, load_balance={lb}, causal={causal}"] = compare(dims, lb, causal)
record["multi-head (no grouping)"] = compare(ParallelDims(context=4), True, True, heads=2, kv_heads=2)


def transformers_llama():
    """A transformers LlamaForCausalLM (GQA, rotary, its own mask building) under CP: logits and
    the gradient of the loss (labels shifted before the split, as the Trainer's shift_labels)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double()
    tokens = torch.randint(0, 128, (4, 33), generator=torch.Generator().manual_seed(1))
    reference = model(input_ids=tokens[:, :-1]).logits
    expected = torch.autograd.grad(
        F.cross_entropy(reference.flatten(0, 1), tokens[:, 1:].flatten()), model.parameters()
    )
    plan = spmd.context_parallel(model, ParallelDims(fsdp=2, context=2).mesh())
    batch = plan.shard_batch({"input_ids": tokens[:, :-1], "shift_labels": tokens[:, 1:]})
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    loss = F.cross_entropy(logits.flatten(0, 1), batch["shift_labels"].flatten())
    grads = torch.autograd.grad(loss, model.parameters())
    summed = [g.clone() for g in grads]
    for g in summed:  # every shard's gradient of its tokens' mean: their mean is the whole batch's
        dist.all_reduce(g)
    errors = [(logits - plan.shard_batch(reference.detach())).abs().max().item()]
    errors += [max((g / 4 - e).abs().max().item() for g, e in zip(summed, expected))]
    implementation = model.config._attn_implementation
    plan.remove()
    return errors + [int(implementation == "spmd_context_parallel" and model.config._attn_implementation == "sdpa")]


record["transformers llama"] = transformers_llama()
mesh = ParallelDims(context=4).mesh()
masked = Wrapper(Attention(causal=False, mask=torch.ones(8, 8, dtype=torch.bool)))
plan = spmd.context_parallel(masked, mesh)
x = torch.ones(2, 2, 8, 4)
record["explicit mask"] = refusal(lambda: masked(x, x, x))
record["odd sequence"] = refusal(lambda: plan.shard_batch(torch.ones(2, 12)))
record["no context axis"] = refusal(lambda: spmd.context_parallel(masked, ParallelDims(fsdp=4).mesh()))
record["unknown strategy"] = refusal(lambda: spmd.context_parallel(masked, mesh, strategy="ulysses"))
laid_out = spmd.mark_sharding(torch.ones(4, 16), ParallelDims(fsdp=4).mesh(), spmd.P(None, "fsdp"))
record["already laid out"] = refusal(lambda: plan.shard_batch({"input_ids": laid_out}))
record["ragged batch"] = refusal(lambda: plan.shard_batch({"input_ids": torch.ones(4, 16), "labels": torch.ones(4, 8)}))
(out / f"rank{rank}.json").write_text(json.dumps(record))
dist.barrier()
dist.destroy_process_group()
