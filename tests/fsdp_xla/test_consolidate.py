"""``python -m fsdp_xla.consolidate``: bad outputs fail with one line (exit 2 at parse time, exit
1 when the write itself fails), and nothing is written into the checkpoint being read. Host
tensors: no XLA runtime needed."""

import errno
import json
import re
import sys

import pytest
import torch

import fsdp_xla.checkpoint as ck
from fsdp_xla.consolidate import main


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    ck.save_sharded(tmp_path / "ck", torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)))
    return tmp_path / "ck"


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (lambda ck_dir: "", "--output/-o: is empty"),
        (lambda ck_dir: str(ck.checkpoint_version(ck_dir) / "device-00000.pt"), r"is inside v-\S+ of the checkpoint"),
    ],
)
def test_bad_outputs_are_refused_at_parse_time(checkpoint, capsys, output, message):
    files = sorted(p.name for p in checkpoint.rglob("*"))
    with pytest.raises(SystemExit) as e:
        main([str(checkpoint), "-o", output(checkpoint)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("error:") == 1, err
    assert sorted(p.name for p in checkpoint.rglob("*")) == files


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_an_output_that_cannot_be_written_is_refused_when_parsed(checkpoint, capsys):
    with pytest.raises(SystemExit) as exit:
        main([str(checkpoint), "-o", "/proc/m.safetensors"])
    assert exit.value.code == 2 and "/proc" in capsys.readouterr().err


def test_a_failed_write_is_one_line_and_exit_1(checkpoint, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "m.safetensors"
    assert main([str(checkpoint), "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fsdp_xla.consolidate: cannot write {out}: No space left on device") and "\n" not in err
    assert list(out.parent.iterdir()) == []  # no file, no temp file left


def test_a_block_unlike_its_index_is_refused_before_allocating(checkpoint, capsys):
    version = ck.checkpoint_version(checkpoint)
    meta = json.loads((version / "index.json").read_text())
    entry = meta["tensors"]["model/0.bias"]
    entry["shape"], entry["blocks"][0]["index"] = [2**40, 2**20], [[0, 2**40], [0, 2**20]]  # 4 PiB of float32
    (version / "index.json").write_text(json.dumps(meta))
    assert main([str(checkpoint), "-o", str(checkpoint.parent / "m.pt")]) == 1
    assert "'model/0.bias': the block in" in capsys.readouterr().err
    assert not (checkpoint.parent / "m.pt").exists()
