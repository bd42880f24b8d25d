"""Sliding windows in the planner's attention (`spmd.plan.request.attention`): the splash kernel's
local mask and ``dot`` attention's mask are Hugging Face's own sliding-window mask."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd.plan.request.attention import splash_mask, window_mask


def hugging_face_window(seq: int, window: int) -> np.ndarray:
    import torch
    from transformers.masking_utils import sliding_window_causal_mask_function

    seen = sliding_window_causal_mask_function(window)
    q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    return seen(0, 0, q, k).expand(seq, seq).numpy()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 48))
def test_both_masks_are_hugging_face_s_sliding_window(seq, window):
    want = hugging_face_window(seq, window)
    assert np.array_equal(window_mask(seq, seq, window)[0, 0].numpy(), want)
    assert np.array_equal(np.asarray(splash_mask(seq, True, window)[:, :]), want)


@pytest.mark.parametrize("causal", [True, False])
def test_no_window_is_the_causal_or_full_mask(causal):
    mask = np.asarray(splash_mask(16, causal, None)[:, :])
    assert np.array_equal(mask, np.tril(np.ones((16, 16), bool)) if causal else np.ones((16, 16), bool))
