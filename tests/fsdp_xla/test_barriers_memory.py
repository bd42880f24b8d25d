"""The optimization barriers, proven from the partitioned HLO and XLA's memory report.

One training step of a 4-block GPT on 8 devices, compiled with and without barriers:
- with barriers, every block weight is all-gathered twice (forward, and again for backward);
  without, XLA's CSE merges the two gathers and the forward copy stays alive until backward;
- with barriers, the forward+backward graph's per-device peak is its arguments and outputs,
  the activations, and about one block's gathered weights and one block's full gradients;
  without, it holds several blocks' weights at once.
"""

import pytest
import torch

from fsdp_xla import FSDP, transformer_auto_wrap_policy
from fsdp_xla._gspmd_unit import BACKWARD_GRAPH_NAME
from spmd import P, mark_sharding
from spmd.inspector import CollectiveKind, capture
from tests.fsdp_xla.helpers import GPT, Block, batches, fsdp_mesh, lm_loss

CONFIG = dict(vocab=256, d_model=256, n_head=4, n_layer=4, seq=32)


def compile_step(xla, barriers, batch):
    import torch_xla

    mesh = fsdp_mesh()
    torch.manual_seed(0)
    model = FSDP(
        GPT(**CONFIG),
        mesh=mesh,
        auto_wrap_policy=transformer_auto_wrap_policy({Block}),
        optimization_barriers=barriers,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    (tokens,) = batches(1, batch=batch, seq=CONFIG["seq"], vocab=CONFIG["vocab"], seed=batch)
    with capture(ignore=["parameter-all-gather", "replicated-argument"]) as report:
        tokens = tokens.to(xla)
        mark_sharding(tokens, mesh, P("fsdp", None))
        loss = lm_loss(model(tokens[:, :-1]), tokens)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
    graphs = [g for g in report.graphs if g.name.startswith(BACKWARD_GRAPH_NAME)]
    assert len(graphs) == 1, [g.name for g in report.graphs]
    unit_bytes = 4 * sum(p.numel() for p in model.h[0].parameters())
    weights = {n: p for n, p in model.named_parameters() if n.startswith("h.") and p.dim() == 2}
    return graphs[0], unit_bytes, weights


@pytest.fixture(scope="module")
def steps(xla):
    return {
        "barriers": compile_step(xla, True, 16),
        "barriers_2x_batch": compile_step(xla, True, 32),
        "no_barriers": compile_step(xla, False, 16),
    }


def gathers_per_weight(graph, weights):
    """{weight name: number of all-gathers reading that parameter}."""
    counts = {}
    for p in graph.parameters:
        if p.name in weights:
            counts[p.name] = sum(
                1 for c in graph.collectives if c.kind is CollectiveKind.ALL_GATHER and c.source_parameter == p.number
            )
    return counts


def test_with_barriers_each_block_weight_is_gathered_in_forward_and_again_in_backward(steps):
    graph, _, weights = steps["barriers"]
    counts = gathers_per_weight(graph, weights)
    assert len(counts) == len(weights) == 4 * 4  # c_attn, attn.c_proj, c_fc, c_proj per block
    assert set(counts.values()) == {2}, counts


def test_without_barriers_cse_merges_the_two_gathers(steps):
    graph, _, weights = steps["no_barriers"]
    counts = gathers_per_weight(graph, weights)
    assert len(counts) == 16
    assert set(counts.values()) == {1}, counts


def test_peak_holds_about_one_block_of_gathered_weights_and_gradients(steps):
    graph, unit_bytes, _ = steps["barriers"]
    bigger, _, _ = steps["barriers_2x_batch"]
    m = graph.memory
    # Activations scale with the batch, the rest does not: doubling it measures them.
    activations = bigger.memory.peak_bytes - m.peak_bytes
    assert activations > 0
    fixed = m.argument_bytes + m.output_bytes  # sharded weights in, sharded gradients out
    bound = fixed + activations + 2 * unit_bytes  # + one block's weights and one's gradients
    assert m.peak_bytes <= 1.1 * bound, (m.peak_bytes, bound)


def test_without_barriers_several_blocks_of_weights_are_alive(steps):
    with_barriers, unit_bytes, _ = steps["barriers"]
    without, _, _ = steps["no_barriers"]
    assert without.memory.peak_bytes - with_barriers.memory.peak_bytes >= 2 * unit_bytes
