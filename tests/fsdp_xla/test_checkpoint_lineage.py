"""A checkpoint directory is owned: a save removes only versions of its own lineage (this
process's saves there, and the version it loaded from there); another run's versions, versions
from before lineages were recorded, and anything it cannot read as an index stay, byte for byte.
The example refuses a directory holding versions but no LATEST. Host tensors: no XLA runtime."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla import CheckpointError
from fsdp_xla.checkpoint._files import prune
from tests.fsdp_xla.helpers import load_example
from tests.torchrun import ROOT, WORKERS, child_env

RACE_WORKER = WORKERS / "checkpoint_race_worker.py"


def model(seed=0, width=8):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4))


def their_model():
    """The model `other_run_saves` saves (checkpoint_race_worker.py's)."""
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))


def versions(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("v-"))


def hashes(root, names):
    """sha256 of every file under the version directories ``names``, by relative path."""
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for name in names
        for f in sorted((root / name).rglob("*"))
        if f.is_file()
    }


def tree(root):
    """sha256 of every file under ``root`` (but the lock), by relative path; directories too."""
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else "dir"
        for f in sorted(root.rglob("*"))
        if f.name != ".lock"
    }


def other_run_saves(root, seed, count):
    """``count`` saves (keep=1) of another model by another process: another run's lineage."""
    run = subprocess.run(
        [sys.executable, str(RACE_WORKER), "save_loop", str(root), str(seed), str(count)],
        env=child_env(xla=False),
        capture_output=True,
        timeout=300,
    )
    assert run.returncode == 0 and b"DONE" in run.stdout, run.stderr.decode()[-2000:]


def test_a_run_pointed_at_another_models_checkpoint_removes_none_of_it(tmp_path):
    root = tmp_path / "ck"
    other_run_saves(root, seed=1, count=2)  # model A, another process: one version (keep=1) and LATEST
    theirs = versions(root)
    before = hashes(root, theirs)
    assert len(theirs) == 1 and len(before) == 2  # index.json and device-00000.safetensors
    everything = tree(root)
    with pytest.raises(CheckpointError, match=r"holds another run's checkpoint .* names v-.*, of lineage [0-9a-f]{32}"):
        ck.save_sharded(root, model(2, width=12))  # model B would re-point A's LATEST: refused
    assert tree(root) == everything  # nothing written, nothing removed, LATEST still A's
    (root / "LATEST").unlink()  # the user hands the directory over; A's version stays
    written = [ck.save_sharded(root, model(2, width=12), keep=2, extra={"i": i}) for i in range(5)]  # model B
    assert hashes(root, theirs) == before  # every byte of A's version survives
    assert [v.exists() for v in written] == [False, False, False, True, True]  # B keeps its own newest 2
    assert versions(root) == sorted([*theirs, written[3].name, written[4].name])
    assert ck.checkpoint_version(root) == written[4]
    (root / "LATEST").write_text(theirs[0] + "\n")  # A's version is still whole: it loads
    a = their_model()
    assert ck.load_sharded(root, a) == {"seed": 1, "i": 1}
    assert a[0].bias[0].item() == 1001.0


def test_keep_n_keeps_the_newest_n_of_its_own_lineage_across_a_restart(tmp_path):
    root = tmp_path / "ck"
    mine = [ck.save_sharded(root, model(), keep=3, extra={"i": i}) for i in range(5)]
    assert [v.exists() for v in mine] == [False, False, True, True, True]
    restarted = tmp_path / "restarted"
    other_run_saves(restarted, seed=3, count=3)  # a run killed after its third save...
    first = versions(restarted)
    m = their_model()
    assert ck.load_sharded(restarted, m) == {"seed": 3, "i": 2}  # ...resumed by this process
    later = [ck.save_sharded(restarted, m, keep=2, extra={"i": i}) for i in (3, 4)]
    assert versions(restarted) == sorted(v.name for v in later)  # the loaded version was its lineage's: removed
    assert first[0] not in versions(restarted)


def test_versions_from_before_lineages_still_load_and_are_never_removed(tmp_path):
    root = tmp_path / "ck"
    old = ck.save_sharded(root, model(4), extra={"old": True})
    meta = json.loads((old / "index.json").read_text())
    del meta["lineage"]  # as a save before lineages wrote it
    (old / "index.json").write_text(json.dumps(meta))
    before = hashes(root, [old.name])
    loaded = model(5)
    assert ck.load_sharded(root, loaded) == {"old": True}
    assert torch.equal(loaded[0].weight, model(4)[0].weight)
    newer = [ck.save_sharded(root, model(4), keep=1) for _ in range(3)]
    assert [v.exists() for v in newer] == [False, False, True]
    assert hashes(root, [old.name]) == before  # it cannot be proven this lineage's: it stays


def write_version(root, name, index):
    (root / name).mkdir(parents=True)
    (root / name / "index.json").write_text(index)


def test_prune_removes_only_versions_whose_index_records_its_lineage(tmp_path):
    """`prune` on files alone: what it removes and what it never touches."""
    mine, theirs = "a" * 32, "b" * 32
    names = [f"v-20260101T00000{i}-0000000{i}" for i in range(7)]
    write_version(tmp_path, names[0], json.dumps({"lineage": mine}))
    write_version(tmp_path, names[1], json.dumps({"lineage": theirs}))
    write_version(tmp_path, names[2], json.dumps({"format": "fsdp_xla.sharded/1"}))  # before lineages
    write_version(tmp_path, names[3], "{not json")
    write_version(tmp_path, names[4], json.dumps({"lineage": mine.upper()}))  # not an id a save writes
    write_version(tmp_path, names[5], json.dumps({"lineage": mine}))
    write_version(tmp_path, names[6], json.dumps({"lineage": mine}))  # the save just committed
    before = hashes(tmp_path, names[1:5])
    prune(tmp_path, names[6], keep=2, lineage=mine)
    assert versions(tmp_path) == names[1:]  # only the oldest of its own lineage went
    prune(tmp_path, names[6], keep=1, lineage=mine)
    assert versions(tmp_path) == [*names[1:5], names[6]]
    assert hashes(tmp_path, names[1:5]) == before


def test_versions_are_ordered_by_their_lineage_sequence_never_by_file_times(tmp_path):
    """A touched older index (a backup restore, a copy) made a save delete the newer version."""
    root = tmp_path / "ck"
    m = model()
    first, second = (ck.save_sharded(root, m, keep=2, extra={"i": i}) for i in range(2))
    assert [json.loads((v / "index.json").read_text())["sequence"] for v in (first, second)] == [1, 2]
    future = (first / "index.json").stat().st_mtime + 3600
    os.utime(first / "index.json", (future, future))  # the older version now looks the newest
    third = ck.save_sharded(root, m, keep=2, extra={"i": 2})
    assert json.loads((third / "index.json").read_text())["sequence"] == 3
    assert versions(root) == sorted([second.name, third.name])  # the oldest by sequence went, not the newest


def test_prune_orders_by_sequence_and_keeps_what_it_cannot_order(tmp_path):
    mine = "a" * 32
    names = [f"v-20260101T00000{i}-0000000{i}" for i in range(6)]
    write_version(tmp_path, names[0], json.dumps({"lineage": mine, "sequence": 4}))  # named first, saved last
    write_version(tmp_path, names[1], json.dumps({"lineage": mine}))  # before sequences: the oldest
    write_version(tmp_path, names[2], json.dumps({"lineage": mine, "sequence": 2}))
    write_version(tmp_path, names[3], json.dumps({"lineage": mine, "sequence": "3"}))  # edited: kept
    write_version(tmp_path, names[4], json.dumps({"lineage": mine, "sequence": 3}))
    write_version(tmp_path, names[5], json.dumps({"lineage": mine, "sequence": 5}))  # the save just committed
    prune(tmp_path, names[5], keep=2, lineage=mine)
    assert versions(tmp_path) == [names[0], names[3], names[5]]


def test_has_checkpoint_tells_a_fresh_directory_from_one_it_must_not_train_over(tmp_path):
    assert ck.has_checkpoint(tmp_path / "missing") is False
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "notes.txt").write_text("mine")
    (tmp_path / "fresh" / ".v-20260101T000000-00000000.partial").mkdir()  # a first save killed midway
    assert ck.has_checkpoint(tmp_path / "fresh") is False
    root = tmp_path / "ck"
    version = ck.save_sharded(root, model())
    assert ck.has_checkpoint(root) is True
    (root / "LATEST").unlink()
    message = rf"{root} holds 1 checkpoint version\(s\) \({version.name}\) but no LATEST: .* Give another checkpoint"
    with pytest.raises(CheckpointError, match=message):
        ck.has_checkpoint(root)
    with pytest.raises(CheckpointError, match=message):  # a load says the same
        ck.load_sharded(root, model())


def test_train_fsdp_refuses_a_directory_with_versions_but_no_latest_and_writes_nothing(tmp_path, monkeypatch, capsys):
    root = tmp_path / "ck"
    other_run_saves(root, seed=1, count=1)
    (root / "LATEST").unlink()
    (root / ".lock").unlink()
    before = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    # The script's main in this process, named as `python examples/train_fsdp.py` names it
    # (argparse takes the program from sys.argv[0]): the refusal is its flag parsing, before any
    # runtime or rank starts, so a process of its own (3.5 s quiet, 18-27 s under the suite's
    # load) added nothing. A refusal that regressed trains and returns, or exits with the
    # launched ranks' status 0: this fails either way.
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / "train_fsdp.py")])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        load_example("train_fsdp").main(["--checkpoint-dir", str(root), "--save-every", "1", "--steps", "2"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(f"train_fsdp.py: error: --checkpoint-dir: {root} holds 1 checkpoint version(s)")
    assert "but no LATEST" in lines[0] and "Give another checkpoint directory" in lines[0]
    assert "launching" not in out  # refused before any rank started
    after = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in root.iterdir()) == versions(root)


def plant_killed_save(root, lineage, name):
    """What a save of ``lineage`` killed midway leaves: its temp directory (with its lineage
    record and a half-written file) and a temp LATEST."""
    partial = root / f".{name}.partial"
    partial.mkdir(parents=True)
    (partial / ".lineage").write_text(lineage)
    (partial / "device-00000.safetensors").write_bytes(b"half written " + lineage.encode())
    (root / f".LATEST.{lineage}.x1y2z3.tmp").write_text(name + "\n")
    return partial


def test_a_second_run_removes_none_of_the_first_runs_temp_files_in_progress_or_killed(tmp_path):
    """Run A (another process) saved, and has a save in progress; run B (this process) points its
    saves at the same directory: every byte of A's files survives, temp files included, while B's
    own killed save is cleaned up."""
    root = tmp_path / "ck"
    other_run_saves(root, seed=1, count=1)
    theirs = json.loads((root / versions(root)[0] / "index.json").read_text())["lineage"]
    plant_killed_save(root, theirs, "v-20260101T000000-0000000a")  # A's save in progress
    (root / ".v-20260101T000001-0000000b.partial").mkdir()  # a save (of whom?) before its record
    (root / ".LATEST.abcdefgh.tmp").write_text("?")  # a temp LATEST of a save before lineages
    (root / "LATEST").unlink()  # so that B may save here at all (see the test above)
    before = tree(root)
    first = ck.save_sharded(root, model(2))  # B's lineage starts here
    mine = json.loads((first / "index.json").read_text())["lineage"]
    assert mine != theirs
    my_killed = plant_killed_save(root, mine, "v-20260101T000002-0000000c")
    for _ in range(3):
        ck.save_sharded(root, model(2), keep=1)
    after = tree(root)
    assert {k: v for k, v in after.items() if k in before} == before  # every byte of A's (and unknown) files
    assert not my_killed.exists() and not list(root.glob(f".LATEST.{mine}.*"))  # B's own leftovers went


def test_a_run_resumed_from_one_of_its_directories_saves_into_another_of_them(tmp_path):
    """The Hugging Face trainer resumes from checkpoint-5 and saves checkpoint-10, which the run
    wrote before it was killed: that LATEST is of the lineage this process loaded, so the save
    goes ahead (and continues it), where another run's LATEST is refused."""
    other_run_saves(tmp_path / "checkpoint-5", seed=1, count=1)
    shutil.copytree(tmp_path / "checkpoint-5", tmp_path / "checkpoint-10")  # the same run's other directory
    old = versions(tmp_path / "checkpoint-10")
    m = their_model()
    ck.load_sharded(tmp_path / "checkpoint-5", m)
    new = ck.save_sharded(tmp_path / "checkpoint-10", m, keep=1)
    assert versions(tmp_path / "checkpoint-10") == [new.name] and old != [new.name]  # its own older version went
    lineage = json.loads((tmp_path / "checkpoint-5" / old[0] / "index.json").read_text())["lineage"]
    assert json.loads((new / "index.json").read_text())["lineage"] == lineage
