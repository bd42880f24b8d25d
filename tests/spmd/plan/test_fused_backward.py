"""``--splash-blocks use_fused_bwd_kernel=true`` (`spmd.plan.request.splash_blocks`): the step runs
splash's fused backward, one kernel over the key gradient's blocks that computes the query gradient
too, and the step-time model costs it as 5 matmuls a pair of blocks, where the two kernels of the
unfused backward run 4 and 3. The compiles run in processes of their own (libtpu and torchax stay
out of the test session)."""

import pytest

from spmd.plan.predict._op_costs import splash_matmuls, splash_phase
from spmd.plan.request.attention import FUSED_BACKWARD_SCOPE
from tests.spmd.plan.child_compile import splash_step

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
    "max_position_embeddings": 4096,
}  # fmt: skip


# Blocks of 256 over 512 tokens: 3 causal pairs of blocks, the diagonal's 2 and the one below.
FUSED = splash_step(LLAMA, "256,use_fused_bwd_kernel=true", 512)
UNFUSED = splash_step(LLAMA, "256", 512)


def _by_phase(result: dict) -> dict[str, set[float]]:
    phases: dict[str, set[float]] = {}
    for name, flops in result["flops"].items():
        phases.setdefault(splash_phase(name), set()).add(flops)
    return phases


@pytest.mark.reads(FUSED, UNFUSED)
def test_the_fused_backward_runs_one_kernel_costed_as_both():
    fused, unfused = FUSED.result(), UNFUSED.result()
    assert {splash_phase(n) for n in fused["kernels"]} == {"fwd", "dkv"}, fused["kernels"]
    assert {splash_phase(n) for n in unfused["kernels"]} == {"fwd", "dq", "dkv"}, unfused["kernels"]
    # jax 0.12 names the fused kernel as the unfused dkv kernel: the planner's scope tells them apart
    for name, kernel in fused["kernels"].items():
        op_name = kernel["scope"]
        if splash_phase(name) == "dkv":
            assert f"/{FUSED_BACKWARD_SCOPE}" in op_name and splash_matmuls(name, op_name) == 5, (name, op_name)
    for name, kernel in unfused["kernels"].items():
        op_name = kernel["scope"]
        assert FUSED_BACKWARD_SCOPE not in op_name and splash_matmuls(name, op_name) in (2, 3, 4)
    # the same blocks of 256 and the same causal pairs: cost in proportion to the matmuls
    fused_phases, unfused_phases = _by_phase(fused), _by_phase(unfused)
    (forward,) = fused_phases["fwd"]
    assert unfused_phases["fwd"] == {forward}
    for phases, phase, matmuls in ((fused_phases, "dkv", 5), (unfused_phases, "dkv", 4), (unfused_phases, "dq", 3)):
        (flops,) = phases[phase]
        assert flops == pytest.approx(forward * matmuls / 2), (phase, matmuls)
