"""Wrap policies and mixed precision values: validation with clear messages."""

import dataclasses

import numpy as np
import pytest
import torch

from fsdp_xla import (
    MixedPrecision,
    SizeWrapPolicy,
    TransformerWrapPolicy,
    WrapPolicyError,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from tests.fsdp_xla.helpers import GPT, SMALL, Block


def test_transformer_policy_wraps_instances():
    policy = transformer_auto_wrap_policy({Block})
    assert policy == TransformerWrapPolicy(frozenset({Block}))
    assert transformer_auto_wrap_policy(Block) == policy
    assert policy.should_wrap(Block(8, 2), 0)
    assert not policy.should_wrap(torch.nn.Linear(2, 2), 10**9)


def test_transformer_policy_rejects_names_and_absent_classes():
    with pytest.raises(WrapPolicyError, match="Pass the class itself"):
        transformer_auto_wrap_policy({"GPT2Block"})
    with pytest.raises(WrapPolicyError, match="at least one layer class"):
        transformer_auto_wrap_policy(set())
    with pytest.raises(WrapPolicyError, match=r"names layer class\(es\) \['Conv2d'\] but the model has none"):
        transformer_auto_wrap_policy({torch.nn.Conv2d}).check(GPT(**SMALL))


def test_size_policy():
    policy = size_based_auto_wrap_policy(100)
    assert policy == SizeWrapPolicy(100)
    assert policy.should_wrap(torch.nn.Linear(10, 10), 110)
    assert not policy.should_wrap(torch.nn.Linear(10, 10), 99)
    assert not policy.should_wrap(torch.nn.ModuleList(), 10**6)
    with pytest.raises(WrapPolicyError, match="must be >= 1"):
        size_based_auto_wrap_policy(0)
    with pytest.raises(WrapPolicyError, match="must be an int"):
        size_based_auto_wrap_policy(1.5)


def test_size_policy_takes_numpy_ints_and_one_exclude_class():
    policy = size_based_auto_wrap_policy(np.int64(100))
    assert policy.min_num_params == 100 and type(policy.min_num_params) is int
    assert SizeWrapPolicy(100, exclude=torch.nn.Linear).exclude == (torch.nn.Linear,)
    assert not SizeWrapPolicy(100, exclude=[torch.nn.Linear]).should_wrap(torch.nn.Linear(10, 10), 110)


@pytest.mark.parametrize("exclude", [5, "Linear", (torch.nn.Linear, 5), (torch.nn.Linear(2, 2),), int])
def test_size_policy_refuses_an_exclude_that_is_not_module_classes(exclude):
    with pytest.raises(WrapPolicyError, match=r"exclude=\.\.\.\) takes a tuple of nn.Module classes"):
        SizeWrapPolicy(100, exclude=exclude)


def test_mixed_precision():
    mp = MixedPrecision(torch.bfloat16)
    assert mp.effective_buffer_dtype is torch.bfloat16 and mp.effective_reduce_dtype is torch.bfloat16
    assert MixedPrecision(torch.bfloat16, reduce_dtype=torch.float32).effective_reduce_dtype is torch.float32
    with pytest.raises(TypeError, match=r"MixedPrecision.param_dtype must be a floating torch.dtype"):
        MixedPrecision("bfloat16")
    with pytest.raises(TypeError, match=r"MixedPrecision.compute_dtype must be a floating torch.dtype"):
        MixedPrecision(compute_dtype="bfloat16")  # the message names the keyword given
    with pytest.raises(TypeError, match="reduce_dtype"):
        MixedPrecision(torch.bfloat16, reduce_dtype=torch.int8)


def test_mixed_precision_fields_are_fsdp2s_names_and_the_old_ones_are_aliases():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    new = MixedPrecision(param_dtype=torch.bfloat16, cast_forward_inputs=False)
    old = MixedPrecision(compute_dtype=torch.bfloat16, cast_inputs=False)
    assert new == old and hash(new) == hash(old)
    assert (old.param_dtype, old.cast_forward_inputs) == (torch.bfloat16, False)
    assert (new.compute_dtype, new.cast_inputs) == (torch.bfloat16, False)
    assert repr(new) == (
        "MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=None, reduce_dtype=None, cast_forward_inputs=False)"
    )
    fsdp2 = {f for f in MixedPrecisionPolicy.__dataclass_fields__}
    assert {"param_dtype", "reduce_dtype", "cast_forward_inputs"} <= fsdp2
    assert {"param_dtype", "reduce_dtype", "cast_forward_inputs"} <= set(MixedPrecision.__dataclass_fields__)
    assert dataclasses.replace(old, reduce_dtype=torch.float32).effective_reduce_dtype is torch.float32
    with pytest.raises(TypeError, match="compute_dtype is param_dtype's old name: give param_dtype only"):
        MixedPrecision(param_dtype=torch.bfloat16, compute_dtype=torch.float16)
    with pytest.raises(TypeError, match="cast_inputs is cast_forward_inputs's old name"):
        MixedPrecision(cast_forward_inputs=True, cast_inputs=False)
