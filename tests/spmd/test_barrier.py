import pytest
import torch

from spmd import NotAnXlaTensorError, optimization_barrier
from spmd._backend import backend


def test_barrier_appears_in_hlo_and_keeps_values(xla):
    a = torch.ones(4, 4).to(xla) * 2
    b = torch.ones(4).to(xla) + 1
    out_a, out_b = optimization_barrier(a, b)
    assert out_a is a and out_b is b
    assert "opt-barrier" in backend.tensors_hlo_text([a + b])
    torch.testing.assert_close((a + b).cpu(), torch.full((4, 4), 4.0))


def test_barrier_rejects_cpu_tensors(xla):
    with pytest.raises(NotAnXlaTensorError, match="argument 1 is on 'cpu'"):
        optimization_barrier(torch.ones(2).to(xla), torch.ones(2))
    assert optimization_barrier() == ()
