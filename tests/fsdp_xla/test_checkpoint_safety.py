"""Checkpoints stay inside their directory, survive a full disk and concurrent saves, and a bad
index fails before any tensor is read, naming the entry. Host tensors: no XLA runtime needed."""

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError
from fsdp_xla.checkpoint._format import DTYPE_NAMES, Block, CheckpointIndex, TensorEntry, parse_index
from tests.torchrun import WORKERS

ROOT = Path(__file__).resolve().parents[2]
WORKER = WORKERS / "checkpoint_race_worker.py"


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def worker(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
    )


def test_dtype_names_are_the_readers():
    """Every dtype name the index check allows is one the reader turns into torch's dtype."""
    assert all(TensorEntry((), name, ()).torch_dtype == getattr(torch, name) for name in DTYPE_NAMES)


def test_latest_pointing_outside_is_refused(tmp_path):
    root, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    ck.save_sharded(root, model(0))
    shutil.copytree(ck.save_sharded(elsewhere, model(1)), tmp_path / "outside")  # a real checkpoint out there
    (root / "LATEST").write_text("../outside\n")
    target = model(2)
    before = copy.deepcopy(target)
    with pytest.raises(CheckpointError, match=r"LATEST does not hold a checkpoint version name") as e:
        ck.load_sharded(root, target)
    assert "../outside" not in str(e.value)  # the bytes of an unvalidated file are never shown
    assert same_weights(target, before)  # nothing was read from ../outside
    for bad in ("/etc", "v-20260101T000000-abcdef12/../../outside", "", "v-2026"):
        (root / "LATEST").write_text(bad)
        with pytest.raises(CheckpointError, match="does not hold a checkpoint version name"):
            ck.consolidate(root)


def test_links_out_of_the_checkpoint_are_refused(tmp_path):
    root = tmp_path / "ck"
    version = ck.save_sharded(root, model(0))
    outside = ck.save_sharded(tmp_path / "elsewhere", model(1))
    shutil.rmtree(version)
    version.symlink_to(outside, target_is_directory=True)  # the version directory links elsewhere
    target = model(2)
    before = copy.deepcopy(target)
    with pytest.raises(CheckpointError, match="is a symbolic link; version directories inside the checkpoint"):
        ck.load_sharded(root, target)
    assert same_weights(target, before)
    version.unlink()
    shutil.copytree(outside, version)
    shard = version / "device-00000.safetensors"
    shard.unlink()
    shard.symlink_to(outside / "device-00000.safetensors")  # one shard file links elsewhere
    with pytest.raises(CheckpointError, match="is a symbolic link; device files inside the checkpoint"):
        ck.load_sharded(root, target)
    assert same_weights(target, before)


def test_index_naming_a_file_outside_is_refused(tmp_path):
    root = tmp_path / "a" / "b" / "ck"
    version = ck.save_sharded(root, model(0))
    evil = model(1)
    save_file({f"model/{k}": v for k, v in evil.state_dict().items()}, str(version / "../../evil.safetensors"))
    meta = json.loads((version / "index.json").read_text())
    for entry in meta["tensors"].values():
        for block in entry["blocks"]:
            block["file"] = "../../evil.safetensors"
    (version / "index.json").write_text(json.dumps(meta))
    target = model(2)
    before = copy.deepcopy(target)
    with pytest.raises(
        CheckpointError, match=r"index\.json: entry 'model/0\.weight' block 0 names file '\.\./\.\./evil"
    ):
        ck.load_sharded(root, target)
    assert same_weights(target, before) and not same_weights(target, evil)


def good_meta():
    return {
        "format": ck.FORMAT,
        "tensors": {
            "model/w": {
                "shape": [4, 6],
                "dtype": "float32",
                "blocks": [
                    {"file": "device-00000.safetensors", "index": [[0, 2], [0, 6]]},
                    {"file": "device-00001.safetensors", "index": [[2, 4], [0, 6]]},
                ],
            }
        },
        "aliases": {},
        "optimizer": {},
        "extra": {},
    }


def broken(change):
    meta = good_meta()
    change(meta)
    return meta


def set_path(*path_and_value):
    *path, value = path_and_value

    def change(meta):
        node = meta
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value

    return change


W = ("tensors", "model/w")
B0 = (*W, "blocks", 0)


@pytest.mark.parametrize(
    "change, message",
    [
        (set_path(*W, "dtype", "object"), r"'model/w' has dtype 'object'; allowed"),
        (set_path(*W, "dtype", ["float32"]), r"'model/w' has dtype \"\['float32'\]\"; allowed"),  # was a TypeError
        (set_path(*W, "shape", [4, -6]), r"'model/w' has shape \[4, -6\]"),
        (set_path(*W, "shape", [4, True]), r"'model/w' has shape \[4, True\]"),
        (set_path(*B0, "index", [[0, 2], [0, 7]]), r"block 0 spans \[0, 7\) on dim 1, outside 0\.\.6"),
        (set_path(*B0, "index", [[0, 3], [0, 6]]), "block 1 overlaps another block"),
        (set_path(*B0, "index", [[0, 1], [0, 6]]), r"miss part of shape \[4, 6\] \(from element \[1, 0\]\)"),
        (set_path(*B0, "index", [[0, 2]]), r"block 0 has index \[\[0, 2\]\], not one \[start, stop\] per dim"),
        (set_path(*B0, "file", "/etc/passwd"), "block 0 names file '/etc/passwd'"),
        (set_path(*B0, "file", "device-0.safetensors"), "only device-NNNNN.safetensors"),
        (set_path(*W, "blocks", []), "has no list of blocks"),
        (set_path("tensors", "weights/w", {}), "neither model/<name> nor optim"),
        (set_path("aliases", {"model/v": "model/nope"}), "alias of 'model/nope'"),
        (
            lambda meta: meta.update(
                aliases={"model/v": "optim/w/exp_avg"},
                tensors={**meta["tensors"], "optim/w/exp_avg": meta["tensors"]["model/w"]},
            ),
            "an alias names a model/ tensor",
        ),
        (set_path("format", "pickle/1"), "has format 'pickle/1'"),
        (set_path("optimizer", {"param_groups": "all"}), "param_groups"),
        (
            set_path(
                *W,
                "blocks",
                [
                    {"file": "device-00000.safetensors", "index": [[i, i + 1], [j, j + 1]]}
                    for i in range(4)
                    for j in range(6)
                ][:-1]
                + [{"file": "device-00001.safetensors", "index": [[0, 4], [0, 6]]}],
            ),
            "overlaps another block",
        ),
    ],
)
def test_bad_index_entries_fail_fast_naming_the_entry(change, message, tmp_path):
    parse_index(good_meta(), tmp_path / "index.json")  # the unbroken one passes
    with pytest.raises(CheckpointError, match=message):
        parse_index(broken(change), tmp_path / "index.json")


def test_the_index_is_parsed_once_into_frozen_values(tmp_path):
    meta = good_meta()
    meta["tensors"]["model/w"]["blocks"][0]["crc32"] = 7
    meta["aliases"] = {"model/tied": "model/w"}
    index = parse_index(meta, tmp_path / "index.json")
    assert isinstance(index, CheckpointIndex) and index.optimizer is None and index.aliases == {"model/tied": "model/w"}
    assert index.tensors["model/w"] == TensorEntry(
        (4, 6),
        "float32",
        (
            Block("device-00000.safetensors", ((0, 2), (0, 6)), 7),
            Block("device-00001.safetensors", ((2, 4), (0, 6)), None),
        ),
    )
    assert index.tensors["model/w"].blocks[1].region == (slice(2, 4), slice(0, 6))
    assert index.files() == ["device-00000.safetensors", "device-00001.safetensors"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.tensors["model/w"].shape = (1,)
    with pytest.raises(TypeError):  # a read-only mapping: the parse is the one place the index is built
        index.tensors["model/x"] = index.tensors["model/w"]


def test_index_of_many_tiny_blocks_is_not_a_grid(tmp_path, monkeypatch):
    n = 300  # 300 x 300 distinct cut points would make 90,000 cells for 300 blocks
    blocks = [{"file": "device-00000.safetensors", "index": [[i, i + 1], [i, i + 1]]} for i in range(n)]
    meta = broken(set_path(*W, "shape", [n, n]))
    meta["tensors"]["model/w"]["blocks"] = blocks

    def no_cells(*args, **kwargs):
        raise AssertionError("the cells were allocated: refused by counting them, before any array")

    # refused from the count of cut points alone (not timed: a bound in seconds fails under load)
    monkeypatch.setattr("fsdp_xla.checkpoint._format.np", types.SimpleNamespace(zeros=no_cells))
    with pytest.raises(CheckpointError, match="do not form a grid"):
        parse_index(meta, tmp_path / "index.json")


def test_a_damaged_index_on_disk_fails_before_reading_tensors(tmp_path, monkeypatch):
    root = tmp_path / "ck"
    version = ck.save_sharded(root, model(0))
    meta = json.loads((version / "index.json").read_text())
    meta["tensors"]["model/1.bias"]["dtype"] = "complex128"
    (version / "index.json").write_text(json.dumps(meta))
    monkeypatch.setattr(ck._files.Reader, "block", lambda *a: pytest.fail("a tensor was read"))
    with pytest.raises(CheckpointError, match="'model/1.bias' has dtype 'complex128'"):
        ck.load_sharded(root, model(1))


def test_a_full_disk_leaves_the_previous_checkpoint(tmp_path):
    run = worker("full_disk", tmp_path / "ck")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["outcome"].startswith("CheckpointError: Saving to") and "previous checkpoint" in report["outcome"]
    assert report["latest_unchanged"] and report["weights_of_first"] and report["extra"] == {"which": "first"}
    assert len([e for e in report["entries"] if e.startswith("v-")]) == 1
    assert not [e for e in report["entries"] if e.endswith(".partial") or e.startswith(".LATEST")]


def test_concurrent_saves_serialize_and_latest_is_always_complete(tmp_path):
    root = tmp_path / "ck"
    ck.save_sharded(root, model(0))
    savers = [worker("save_loop", root, seed, 6, "resume") for seed in (1, 2)]  # two processes of one run
    loads = 0
    while any(p.poll() is None for p in savers):
        m = model(9)
        extra = ck.load_sharded(root, m)  # never a half-written or removed version
        assert set(extra) in ({"seed", "i"}, set())
        assert m[0].bias[0].item() in (0.0, *(s * 1000.0 + i for s in (1, 2) for i in range(6))) or not extra
        loads += 1
    for p in savers:
        out, err = p.communicate()
        assert p.returncode == 0 and b"DONE" in out, err.decode()[-2000:]
    assert loads > 0
    versions = [p.name for p in root.iterdir() if p.name.startswith("v-")]
    # Both savers continue the first save's lineage (they loaded it): keep=1 leaves the newest.
    assert len(versions) == 1 and (root / "LATEST").read_text().strip() in versions
    assert not list(root.glob(".v-*.partial"))
    final = model(9)
    extra = ck.load_sharded(root, final)
    assert extra["i"] == 5 and final[0].bias[0].item() == extra["seed"] * 1000 + 5


def test_no_version_is_removed_while_being_loaded(tmp_path):
    root = tmp_path / "ck"
    ck.save_sharded(root, model(0), extra={"which": "old"})
    loader = worker("slow_load", root)
    assert loader.stdout.readline().strip() == b"READING"  # it holds the old version now
    started = time.perf_counter()
    ck.save_sharded(root, model(1), extra={"which": "new"})  # keep=1 would remove the old version
    waited = time.perf_counter() - started
    out, err = loader.communicate(timeout=120)
    assert loader.returncode == 0, err.decode()[-2000:]
    assert b'LOADED {"which": "old"}' in out
    assert waited > 1.0  # the save waited for the load to finish before removing it
    assert ck.load_sharded(root, model(2)) == {"which": "new"}


def test_no_symlink_is_followed_inside_the_root_but_the_root_may_be_one(tmp_path):
    root = tmp_path / "ck"
    version = ck.save_sharded(root, model(0))
    secret = tmp_path / "secret.txt"
    secret.write_text("v-20260101T000000-deadbeef password=hunter2\n" * 3)
    target, before = model(2), None
    before = copy.deepcopy(target)
    (root / "LATEST").rename(tmp_path / "LATEST.saved")
    (root / "LATEST").symlink_to(secret)  # LATEST links to a file outside
    with pytest.raises(CheckpointError, match="LATEST is a symbolic link") as e:
        ck.load_sharded(root, target)
    assert "hunter2" not in str(e.value) and same_weights(target, before)
    (root / "LATEST").unlink()
    (tmp_path / "LATEST.saved").rename(root / "LATEST")
    index = version / "index.json"
    index.rename(tmp_path / "index.json")
    index.symlink_to(tmp_path / "index.json")  # the index links out (to a copy of itself)
    with pytest.raises(CheckpointError, match="index.json is a symbolic link; index files"):
        ck.load_sharded(root, target)
    assert same_weights(target, before)
    index.unlink()
    (tmp_path / "index.json").rename(index)
    mounted = tmp_path / "mounted"
    mounted.symlink_to(root, target_is_directory=True)  # the root itself may be a link (a volume)
    ck.load_sharded(mounted, target)
    assert same_weights(target, model(0))


def test_a_fifo_or_a_directory_as_latest_is_refused_without_reading(tmp_path):
    root = tmp_path / "ck"
    ck.save_sharded(root, model(0))
    (root / "LATEST").unlink()
    os.mkfifo(root / "LATEST")  # opening it for reading would wait for a writer forever
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="LATEST is a FIFO; it must be a regular file"):
        ck.load_sharded(root, model(1))
    assert time.monotonic() - started < 5
    (root / "LATEST").unlink()
    (root / "LATEST").mkdir()
    with pytest.raises(CheckpointError, match="LATEST is a directory; it must be a regular file"):
        ck.consolidate(root)


def test_a_corrupted_byte_in_any_block_of_any_shard_changes_nothing(tmp_path):
    """Every block is verified before anything is written: model and optimizer stay bit-identical."""
    saved = model(0)
    opt = torch.optim.AdamW(saved.parameters(), lr=1e-2)
    saved(torch.ones(2, 8)).sum().backward()
    opt.step()
    version = ck.save_sharded(tmp_path / "ck", saved, opt)
    meta = json.loads((version / "index.json").read_text())
    keys = sorted(meta["tensors"])
    assert len(keys) == 16  # 4 parameters, and AdamW's step, exp_avg and exp_avg_sq of each
    for key in (keys[0], keys[len(keys) // 2], keys[-1]):  # the first, a middle and the last block read
        shutil.copytree(version.parent, tmp_path / "damaged", dirs_exist_ok=False)
        shard = tmp_path / "damaged" / version.name / "device-00000.safetensors"
        header = 8 + int.from_bytes(shard.read_bytes()[:8], "little")
        offsets = json.loads(shard.read_bytes()[8:header])[key]["data_offsets"]
        raw = bytearray(shard.read_bytes())
        raw[header + offsets[1] - 1] ^= 0x5A  # the last byte of this block's data
        shard.write_bytes(bytes(raw))
        target = model(3)
        target_opt = torch.optim.AdamW(target.parameters(), lr=1e-2)
        target(torch.ones(2, 8)).sum().backward()
        target_opt.step()
        before_model, before_opt = copy.deepcopy(target.state_dict()), copy.deepcopy(target_opt.state_dict())
        with pytest.raises(CheckpointError, match="checksum"):
            ck.load_sharded(tmp_path / "damaged", target, target_opt)
        assert all(torch.equal(before_model[k], v) for k, v in target.state_dict().items()), key
        after = target_opt.state_dict()["state"]
        assert all(torch.equal(before_opt["state"][i][f], after[i][f]) for i in after for f in after[i]), key
        shutil.rmtree(tmp_path / "damaged")


def test_a_block_stored_in_another_dtype_than_the_index_says_is_refused_not_cast(tmp_path):
    version = ck.save_sharded(tmp_path / "ck", model(0))
    shard = version / "device-00000.safetensors"
    from safetensors.torch import load_file

    blocks = load_file(str(shard))
    blocks["model/0.weight"] = blocks["model/0.weight"].to(torch.int64)  # the index still says float32
    save_file(blocks, str(shard))
    target = model(1)
    before = copy.deepcopy(target)
    with pytest.raises(CheckpointError, match="is stored as int64 where the index says float32: refused, not cast"):
        ck.load_sharded(tmp_path / "ck", target)
    assert same_weights(target, before)


def test_files_a_save_writes_have_the_documented_mode(tmp_path):
    version = ck.save_sharded(tmp_path / "ck", model(0))
    for path in [tmp_path / "ck" / "LATEST", version / "index.json", *version.glob("*.safetensors")]:
        assert path.stat().st_mode & 0o777 == 0o644, path
