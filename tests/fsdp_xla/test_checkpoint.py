"""Sharded checkpoints: round trip with optimizer, consolidation (API and CLI), resharding
8 -> 4 -> 8 devices, a save killed midway, and damaged or mismatched checkpoints."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fsdp_xla import FSDP, CheckpointError, transformer_auto_wrap_policy
from fsdp_xla.checkpoint import checkpoint_version, consolidate, load_sharded, save_sharded
from fsdp_xla.consolidate import main as consolidate_main
from spmd import get_sharding
from tests.fsdp_xla.helpers import GPT, SMALL, Block, batches, fsdp_mesh, train
from tests.torchrun import WORKERS, child_env

ROOT = Path(__file__).resolve().parents[2]
WORKER = WORKERS / "checkpoint_worker.py"


def wrapped(seed=0, **config):
    torch.manual_seed(seed)
    return FSDP(GPT(**(config or SMALL)), mesh=fsdp_mesh(), auto_wrap_policy=transformer_auto_wrap_policy({Block}))


def host_state(model):
    return {k: v.cpu() for k, v in model.state_dict().items()}


def test_round_trip_with_optimizer_continues_training_identically(xla, tmp_path):
    model = wrapped()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = batches(4)
    train_steps(model, optimizer, data[:2], xla)
    version = save_sharded(tmp_path / "ck", model, optimizer, extra={"step": 2})
    assert sorted(p.name for p in version.iterdir())[-1] == "index.json"
    assert len(list(version.glob("device-*.safetensors"))) == 8

    other = wrapped(seed=1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-2)
    assert load_sharded(tmp_path / "ck", other, other_opt) == {"step": 2}
    for k, v in host_state(model).items():
        assert torch.equal(host_state(other)[k], v), k
    assert get_sharding(other.h[0].c_fc.weight) == get_sharding(model.h[0].c_fc.weight)
    assert other.lm_head.weight is other.wte.weight
    assert train_steps(other, other_opt, data[2:], xla) == train_steps(model, optimizer, data[2:], xla)


def train_steps(model, optimizer, data, xla):
    return train(model, data, xla, fsdp_mesh(), optimizer=optimizer)


def test_consolidated_state_loads_into_the_plain_model(xla, tmp_path):
    model = wrapped()
    train(model, batches(1), xla, fsdp_mesh())
    save_sharded(tmp_path / "ck", model)
    full = consolidate(tmp_path / "ck")
    plain = GPT(**SMALL)
    plain.load_state_dict(full)
    tokens = batches(1, seed=5)[0]
    with torch.no_grad():
        expected = model(tokens[:, :-1].to(xla)).cpu()
        torch.testing.assert_close(plain(tokens[:, :-1]), expected, rtol=1e-4, atol=1e-4)
    out = tmp_path / "model.safetensors"
    assert consolidate_main([str(tmp_path / "ck"), "--output", str(out)]) == 0
    from safetensors.torch import load_file

    loaded = load_file(out)
    assert loaded.keys() == full.keys()
    assert all(torch.equal(loaded[k], full[k]) for k in full)


def test_keep_removes_older_versions(xla, tmp_path):
    model = wrapped()
    first = save_sharded(tmp_path / "ck", model)
    second = save_sharded(tmp_path / "ck", model)
    assert not first.exists() and second.exists()
    assert checkpoint_version(tmp_path / "ck") == second
    third = save_sharded(tmp_path / "ck", model, keep=2)
    assert second.exists() and third.exists()


def test_mismatched_and_damaged_checkpoints_name_the_problem(xla, tmp_path):
    with pytest.raises(CheckpointError, match="No sharded checkpoint at"):
        load_sharded(tmp_path / "nothing", wrapped())
    model = wrapped()
    save_sharded(tmp_path / "ck", model)
    wider = wrapped(**{**SMALL, "d_model": 32})
    with pytest.raises(CheckpointError, match=r"'wte.weight' has shape \(64, 64\) in the checkpoint but \(64, 32\)"):
        load_sharded(tmp_path / "ck", wider)
    deeper = wrapped(**{**SMALL, "n_layer": 4})
    with pytest.raises(CheckpointError, match=r"missing \['h.3.attn.c_attn.bias'"):
        load_sharded(tmp_path / "ck", deeper)
    with pytest.raises(CheckpointError, match="has no optimizer state"):
        load_sharded(tmp_path / "ck", wrapped(), torch.optim.AdamW(wrapped().parameters()))
    version = checkpoint_version(tmp_path / "ck")
    shard = version / "device-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"Cannot read '.*' from .*device-00003.safetensors"):
        load_sharded(tmp_path / "ck", wrapped())
    (version / "index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json is not valid JSON"):
        consolidate(tmp_path / "ck")


def test_reshard_8_to_4_to_8_devices_and_survive_a_killed_save(xla, tmp_path):
    ck = tmp_path / "ck"
    model = wrapped()
    train(model, batches(2), xla, fsdp_mesh(), lr=1e-2)
    save_sharded(ck, model, extra={"devices": 8})  # trained and saved on 8 devices (this process)
    trained = host_state(model)

    # Another process on 4 devices loads it, saves from 4, then starts a save that is killed
    # after its first shard file.
    env = child_env()
    cmd = [sys.executable, str(WORKER), "4", str(ck), str(tmp_path / "on4.pt")]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    printed = []
    try:
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("SAVED"):
                saved_from_4 = checkpoint_version(ck)
            if line.startswith("WRITING"):
                break
        else:
            pytest.fail("the 4-device worker ended before its last save: " + proc.stderr.read()[-3000:])
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert "EXTRA {'devices': 8}\n" in printed
    assert checkpoint_version(ck) == saved_from_4  # the killed save changed nothing
    assert list(ck.glob(".v-*.partial"))  # its files, never committed

    back = wrapped(seed=1)  # back on 8 devices, other weights until loaded
    assert load_sharded(ck, back) == {"devices": 4}
    on4, on8, full = torch.load(tmp_path / "on4.pt", weights_only=True), host_state(back), consolidate(ck)
    for k, v in trained.items():
        assert torch.equal(v, on4[k]) and torch.equal(v, on8[k]) and torch.equal(v, full[k]), k


def adam_state_by_name(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        f"{names[id(p)]}/{k}": v.cpu() if isinstance(v, torch.Tensor) else v
        for p, state in optimizer.state.items()
        for k, v in state.items()
    }


def test_optimizer_state_follows_parameter_names_not_positions(xla, tmp_path):
    model = wrapped()
    blocks = [list(model.h[0].parameters()), list(model.h[1].parameters())]
    rest = [p for n, p in model.named_parameters() if not n.startswith("h.")]
    optimizer = torch.optim.AdamW([{"params": blocks[0]}, {"params": blocks[1], "lr": 5e-3}, {"params": rest}], lr=1e-2)
    data = batches(4)
    train_steps(model, optimizer, data[:2], xla)
    save_sharded(tmp_path / "ck", model, optimizer)

    other = wrapped(seed=1)  # the same groups, listed in another order, each group's parameters reversed
    other_blocks = [list(other.h[0].parameters())[::-1], list(other.h[1].parameters())[::-1]]
    other_rest = [p for n, p in other.named_parameters() if not n.startswith("h.")][::-1]
    other_opt = torch.optim.AdamW(
        [{"params": other_rest}, {"params": other_blocks[1], "lr": 5e-3}, {"params": other_blocks[0]}], lr=1e-2
    )
    load_sharded(tmp_path / "ck", other, other_opt)
    saved, loaded = adam_state_by_name(model, optimizer), adam_state_by_name(other, other_opt)
    assert saved.keys() == loaded.keys()
    for key, value in saved.items():
        assert torch.equal(torch.as_tensor(loaded[key]), torch.as_tensor(value)), key
    assert other_opt.param_groups[1]["lr"] == 5e-3 and other_opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert train_steps(other, other_opt, data[2:], xla) == train_steps(model, optimizer, data[2:], xla)

    regrouped = wrapped()  # groups that no saved group matches: refused, and nothing is loaded
    before = host_state(regrouped)
    with pytest.raises(CheckpointError, match=r"group 0 \(.*\) matches no parameter group"):
        load_sharded(
            tmp_path / "ck",
            regrouped,
            torch.optim.AdamW(
                [
                    {"params": list(regrouped.parameters())[:5]},
                    {"params": list(regrouped.parameters())[5:10]},
                    {"params": list(regrouped.parameters())[10:]},
                ]
            ),
        )
    assert all(torch.equal(v, before[k]) for k, v in host_state(regrouped).items())


def test_a_refused_load_leaves_the_model_as_it_was(xla, tmp_path):
    save_sharded(tmp_path / "ck", wrapped())
    longer = wrapped(seed=1, **{**SMALL, "seq": 32})  # wpe differs, and comes after wte in the state dict
    before = host_state(longer)
    with pytest.raises(CheckpointError, match=r"'wpe.weight' has shape \(16, 64\) in the checkpoint.*Nothing was"):
        load_sharded(tmp_path / "ck", longer)
    assert all(torch.equal(v, before[k]) for k, v in host_state(longer).items())
    model = wrapped(seed=1)
    before = host_state(model)
    with pytest.raises(CheckpointError, match="has no optimizer state"):
        load_sharded(tmp_path / "ck", model, torch.optim.AdamW(model.parameters()))
    assert all(torch.equal(v, before[k]) for k, v in host_state(model).items())
    renamed = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match="holds none of the model's 2 tensors"):
        load_sharded(tmp_path / "ck", renamed, strict=False)


def test_damaged_data_is_caught_by_its_checksum(xla, tmp_path):
    save_sharded(tmp_path / "ck", wrapped())
    shard = checkpoint_version(tmp_path / "ck") / "device-00005.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-200:-136] = bytes(b ^ 0xFF for b in raw[-200:-136])  # inside the tensor data, the header intact
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"device-00005.safetensors does not have the checksum"):
        consolidate(tmp_path / "ck")


def test_saves_touch_only_what_they_wrote(xla, tmp_path):
    root = tmp_path / "ck"
    for folder in ("v-1.0-results", "v-20250101T000000-deadbeef"):  # the second has a version's name
        (root / folder).mkdir(parents=True)
        (root / folder / "notes.txt").write_text("mine")
    (root / ".LATEST.abc.tmp").write_text("left by a killed save")
    model = wrapped()
    versions = [save_sharded(root, model, keep=2, extra={"step": step}) for step in range(4)]  # in one second
    assert [v.exists() for v in versions] == [False, False, True, True]  # the newest two, in save order
    assert (root / "v-1.0-results" / "notes.txt").exists()
    assert (root / "v-20250101T000000-deadbeef" / "notes.txt").exists()
    assert not (root / ".LATEST.abc.tmp").exists()
    assert (root / "LATEST").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda p, m, o: load_sharded(None, m), TypeError, "path must be a str or os.PathLike"),
        (lambda p, m, o: load_sharded(p, m.state_dict()), TypeError, "model must be an nn.Module, got OrderedDict"),
        (lambda p, m, o: save_sharded(p, o, m), TypeError, r"got AdamW \(model and optimizer swapped\?\)"),
        (lambda p, m, o: save_sharded(p, m, keep="2"), ValueError, "keep must be an int >= 1"),
        (lambda p, m, o: save_sharded(p, m, extra={"step": torch.tensor(3)}), TypeError, "extra=.* not JSON"),
        (lambda p, m, o: save_sharded(p / "LATEST", m), ValueError, "is a file; a checkpoint is a directory"),
    ],
)
def test_wrong_arguments_are_named_before_anything_is_written(xla, tmp_path, call, error, message):
    model = wrapped()
    save_sharded(tmp_path / "ck", model)
    before = sorted(p.name for p in (tmp_path / "ck").iterdir())
    with pytest.raises(error, match=message):
        call(tmp_path / "ck", model, torch.optim.AdamW(model.parameters()))
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == before
