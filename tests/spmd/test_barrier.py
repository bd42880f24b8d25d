from types import SimpleNamespace

import pytest
import torch

from spmd import NotAnXlaTensorError, optimization_barrier
from spmd._backend import torch_xla_backend


def test_barrier_appears_in_hlo_and_keeps_values(xla):
    a = torch.ones(4, 4).to(xla) * 2
    b = torch.ones(4).to(xla) + 1
    out_a, out_b = optimization_barrier(a, b)
    assert out_a is a and out_b is b
    assert "opt-barrier" in torch_xla_backend.tensors_hlo_text([a + b])
    torch.testing.assert_close((a + b).cpu(), torch.full((4, 4), 4.0))


def test_barrier_rejects_cpu_tensors(xla):
    with pytest.raises(NotAnXlaTensorError, match=r"argument 1 \(tensor of shape \(2,\)\): it is on device 'cpu'"):
        optimization_barrier(torch.ones(2).to(xla), torch.ones(2))
    assert optimization_barrier() == ()


def test_on_dtensor_torchtpus_barrier_runs_where_torchtpu_is_loaded(monkeypatch):
    from spmd._backend.dtensor_backend import DTensorBackend

    passed = []

    def tpu_barrier(tensors):  # TorchTPU's torch.tpu.ops.optimization_barrier: a list in, a list out
        passed.append(len(tensors))
        return [t.clone() for t in tensors]

    monkeypatch.setattr(
        torch, "tpu", SimpleNamespace(ops=SimpleNamespace(optimization_barrier=tpu_barrier)), raising=False
    )
    a, b = torch.ones(2), torch.arange(3.0)
    out = DTensorBackend().barrier([a, b])
    assert passed == [2] and out[0] is not a and torch.equal(out[0], a) and torch.equal(out[1], b)


def test_on_dtensor_without_torchtpu_the_barrier_returns_the_tensors():
    from spmd._backend.dtensor_backend import DTensorBackend

    assert getattr(torch, "tpu", None) is None  # TorchTPU registers torch.tpu only on a TPU
    a = torch.ones(2)
    assert DTensorBackend().barrier([a])[0] is a


def test_backward_barrier_needs_a_module():
    from spmd import SpmdTypeError, apply_backward_optimization_barrier

    with pytest.raises(SpmdTypeError, match="needs an nn.Module, got 'x'"):
        apply_backward_optimization_barrier("x")
