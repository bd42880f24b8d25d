"""The checkpoint functions' arguments are checked before anything is read or written: wrong
types, swapped arguments, flags given as strings, ``extra`` that would not load back as it
went in, state a checkpoint cannot hold, unusable paths. Host tensors: no XLA runtime needed."""

import copy
import os

import numpy as np
import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError
from fsdp_xla.errors import CheckpointTypeError


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))


class WithExtraState(torch.nn.Linear):
    def get_extra_state(self):
        return {"step": 3}

    def set_extra_state(self, state):
        self.state = state


def with_buffer(dtype):
    m = model()
    m.register_buffer("b", torch.zeros(3, dtype=dtype))
    return m


def lbfgs(m):
    opt = torch.optim.LBFGS(m.parameters())

    def closure():
        opt.zero_grad()
        loss = m(torch.ones(2, 8)).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return opt


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p, m: ck.load_sharded(m, p), CheckpointTypeError, r"load_sharded\(path, model, ...\): path and model are swapped"),
        (lambda p, m: ck.save_sharded(m, p), CheckpointTypeError, r"save_sharded\(path, model, ...\): path and model are swapped"),
        (lambda p, m: ck.load_sharded(p, m, strict="no"), CheckpointTypeError, "strict must be True or False, got 'no'"),
        (lambda p, m: ck.consolidate(p, optimizer="no"), CheckpointTypeError, "optimizer must be True or False"),
        (lambda p, m: ck.consolidate(5), CheckpointTypeError, "consolidate: path must be a str or os.PathLike"),
        (lambda p, m: ck.checkpoint_version(5), CheckpointTypeError, "checkpoint_version: path must be a str"),
        (lambda p, m: ck.save_sharded(p, m, extra=[1, 2]), CheckpointTypeError, "extra must be a dict or None, got list"),
        (lambda p, m: ck.save_sharded(p, m, extra="step 5"), CheckpointTypeError, "extra must be a dict or None, got str"),
        (lambda p, m: ck.save_sharded(p, m, extra=0), CheckpointTypeError, "extra must be a dict or None, got int 0"),
        (lambda p, m: ck.save_sharded(p, m, extra={1: 2}), CheckpointTypeError, "has the key 1 .int.; JSON keys are strings"),
        (lambda p, m: ck.save_sharded(p, m, extra={"b": (1, 2)}), CheckpointTypeError, r"extra\['b'\] is a tuple"),
        (lambda p, m: ck.save_sharded(p, m, extra={"x": float("nan")}), CheckpointTypeError, r"extra\['x'\] is nan"),
        (lambda p, m: ck.save_sharded(p, WithExtraState(4, 4)), CheckpointTypeError, "'_extra_state' is a dict, not a tensor"),
        (lambda p, m: ck.save_sharded(p, with_buffer(torch.complex128)), CheckpointTypeError, "'model/b' .* dtype complex128"),
        (lambda p, m: ck.save_sharded(p, (n := model()), lbfgs(n)), CheckpointTypeError, "optimizer state '(al|old_dirs|old_stps|ro)' of '0.weight' is a list"),
    ],
)  # fmt: skip
def test_wrong_arguments_are_refused_before_anything_is_written(tmp_path, call, error, message):
    m = model()
    ck.save_sharded(tmp_path / "ck", m, extra={"step": 1})
    files = sorted(os.listdir(tmp_path / "ck"))
    before = copy.deepcopy(m.state_dict())
    with pytest.raises(error, match=message):
        call(tmp_path / "ck", m)
    assert sorted(os.listdir(tmp_path / "ck")) == files
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert ck.load_sharded(tmp_path / "ck", model(1)) == {"step": 1}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: (root / ".lock").symlink_to(root.parent / "elsewhere"), "lock is a symbolic link"),
        (lambda root: (root / ".lock").mkdir(), "lock is a directory"),
    ],
)
def test_a_save_refuses_a_lock_that_is_not_a_regular_file_and_a_load_reads_without_it(tmp_path, make, message):
    (tmp_path / "elsewhere").write_text("keep")
    root = tmp_path / "ck"
    ck.save_sharded(root, model(0))
    (root / ".lock").unlink()
    make(root)
    files = sorted(os.listdir(root))
    with pytest.raises(CheckpointError, match=message):
        ck.save_sharded(root, model(1))
    assert sorted(os.listdir(root)) == files
    target = model(1)
    ck.load_sharded(root, target)  # no save can run here either, so nothing can change under the load
    assert torch.equal(target[0].weight, model(0)[0].weight)
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_a_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint directory .*file/ck: .*file is a file"):
        ck.save_sharded(tmp_path / "file" / "ck", model())


def test_consolidate_of_a_directory_that_is_no_checkpoint_leaves_nothing(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    with pytest.raises(CheckpointError, match="No sharded checkpoint"):
        ck.consolidate(tmp_path)
    assert os.listdir(tmp_path) == ["mine.txt"]


def test_keep_takes_numpy_ints(tmp_path):
    versions = [ck.save_sharded(tmp_path / "ck", model(), keep=np.int64(2)) for _ in range(3)]
    assert [v.exists() for v in versions] == [False, True, True]


@pytest.mark.parametrize(
    "dtype", [torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64]
)
def test_every_dtype_safetensors_stores_loads_back(tmp_path, dtype):
    saved = with_buffer(dtype)
    saved.b = torch.arange(3).to(dtype)
    ck.save_sharded(tmp_path / "ck", saved)
    target = with_buffer(dtype)
    ck.load_sharded(tmp_path / "ck", target)
    assert target.b.dtype == dtype
    assert torch.equal(target.b.view(torch.uint8), saved.b.view(torch.uint8))


class FreshExtraState(torch.nn.Linear):
    """Its extra state is a tensor made anew on each get_extra_state()."""

    counts = (0.0, 0.0)

    def get_extra_state(self):
        return torch.tensor(self.counts)

    def set_extra_state(self, state):
        self.counts = tuple(state.tolist())


def test_a_tensor_extra_state_goes_back_through_set_extra_state(tmp_path):
    saved = FreshExtraState(4, 4)
    saved.counts = (3.0, 5.0)
    ck.save_sharded(tmp_path / "ck", saved)
    target = FreshExtraState(4, 4)
    ck.load_sharded(tmp_path / "ck", target)
    assert target.counts == (3.0, 5.0)
