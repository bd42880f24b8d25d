"""Our memory math before any compile (spmd/plan/predict/memory.py): what a plan's working set
holds with the weights stored in fp32 or in bf16 (MaxText's weight_dtype). Pure Python."""

from spmd.plan.predict.memory import model_shape, plan_memory
from spmd.plan.request.attention import Attention
from spmd.plan.request.models import BUILTIN_CONFIGS, _hf_config
from spmd.plan.request.remat import Remat

GIB = 2**30


def test_bf16_weights_hold_no_bf16_copy_and_the_same_gradients():
    # Llama 3.1-70B on 32 chips, 2 sequences of 8192 a chip: the parameters a device stores
    shape = model_shape(_hf_config(BUILTIN_CONFIGS["llama3.1-70b"]), 70_553_706_496)
    local = 70_553_706_496 // 32

    def working(weight_bytes):
        return plan_memory(
            shape, Remat.FULL, Attention.FLASH, 8192, 2, 1, 0, weight_bytes * local, weight_bytes=weight_bytes
        ).working

    # fp32 weights: the step computes with a bf16 copy (2 bytes a parameter); bf16 weights are that
    # copy already. Both hold bf16 gradients, so the rest of the working set is the same.
    assert working(4) - working(2) == 2 * local
    assert working(2) > 2 * local  # the gradients of every local parameter are still counted
