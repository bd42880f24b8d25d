"""Every Python snippet in the README and docs/ runs as written, and what it says it prints it prints.

A snippet that starts a program (it configures devices before torch_xla is imported, or
prepares the inspector's dumps) runs in its own process; a fragment that continues the text's
program runs in this test process (8 devices, SPMD on) in a fresh namespace and directory. Both
run after the setup below, which defines only what the surrounding text says the reader already
has (``model``, ``config``, a ``loader``...). A line ``print(x)  # text`` checks that ``x``
prints as ``text`` begins (whitespace and commas ignored). A new snippet runs with no setup,
so it must be complete or get an entry here.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HAS_TORCH_XLA, NEEDS_TORCH_XLA
from tests.torchrun import child_env, warm_launch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DEVICES = "from spmd import configure_default_devices\nconfigure_default_devices()\n"
GPT_SMALL = (
    DEVICES
    + "import numpy as np, torch, torch_xla\nimport spmd\nspmd.enable_spmd()\n"
    + "from mesh import Mesh\nfrom spmd import P\n"
    + "from fsdp_xla import FSDP, transformer_auto_wrap_policy\n"
    + "from examples.train_fsdp import GPT, Block, lm_loss as loss_fn, synthetic_batch\n"
    + "config = dict(vocab=128, d_model=64, n_head=4, n_layer=2, seq=32)\n"
    + "model = GPT(**config)\n"
)
HF_SMALL = (
    DEVICES
    + "import numpy as np, torch, torch_xla, json\nimport spmd\nspmd.enable_spmd()\n"
    + "import fsdp_xla\nfrom mesh import Mesh\nfrom fsdp_xla import FSDP, transformer_auto_wrap_policy\n"
    + "from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, TrainingArguments\n"
    + "from transformers.models.gpt2.modeling_gpt2 import GPT2Block\n"
    + "from fsdp_xla.hf import FSDPTrainer\n"
    + "config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4)\n"
)

# (file name, index of the snippet in it) -> code run before it, or None to only compile it.
SETUP: dict[tuple[str, int], str | None] = {
    ("README.md", 0): GPT_SMALL,
    ("fsdp.md", 0): GPT_SMALL.replace("model = GPT(**config)\n", "")
    + "loader = [synthetic_batch(torch.Generator().manual_seed(0), 16, config['seq'], config['vocab'])] * 2\n",
    ("fsdp.md", 1): GPT_SMALL,
    # parallelize_module and FSDP on DTensor need ranks: compiled only (the example's test runs it).
    ("fsdp.md", 2): None,
    ("fsdp.md", 3): GPT_SMALL,
    ("fsdp.md", 5): HF_SMALL + "mesh = Mesh(np.arange(8), (8,), ('fsdp',))\n",
    ("fsdp.md", 6): GPT_SMALL
    + "mesh = Mesh(np.arange(8), (8,), ('fsdp',))\n"
    + "model = FSDP(model, mesh=mesh, auto_wrap_policy=transformer_auto_wrap_policy({Block}))\n"
    + "optimizer = torch.optim.AdamW(model.parameters())\nstep = 3\n",
    ("huggingface.md", 0): HF_SMALL
    + "import shutil; shutil.copy(r'"
    + str(ROOT / "examples" / "fsdp_config.json")
    + "', 'fsdp_config.json')\n"
    + "from examples.hf_trainer_fsdp import CountingDataset\n"
    + "train_dataset = CountingDataset(16, 32, 128)\n",  # one step per epoch, 3 epochs
    ("huggingface.md", 1): HF_SMALL,
    # Three alternative ways to use one plan, one after the other in the text: compiled only.
    ("huggingface.md", 2): None,
    # TorchTPU's launch recipe needs a TPU (torch.tpu): compiled only.
    ("backends.md", 2): None,
    ("multiprocess.md", 1): None,  # needs a torchrun job to run in; docs/multiprocess.md's first snippet runs one
    ("reliability.md", 0): None,  # needs a lighthouse and torchrun groups: examples/train_heal.py runs it
    ("reliability.md", 1): None,  # a fragment of the loop above
    ("long_context.md", 0): "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
    + "from examples.train_long_context import Llama, synthetic_tokens\n"
    + "torch.manual_seed(0)\nmodel = Llama(d_model=64, layers=2)\ntokens = synthetic_tokens(0, 2, 64, 256)\n",
}
# Fragments run in this process; they need nothing a fresh process would give them.
IN_PROCESS = {
    ("README.md", 0),
    ("fsdp.md", 1),
    ("fsdp.md", 3),
    ("fsdp.md", 5),
    ("fsdp.md", 6),
    ("guide.md", 0),
    ("guide.md", 1),
    ("huggingface.md", 1),
    ("migration.md", 0),
}
# Snippets that run as torchrun jobs: (name, index) -> processes. They are launched from the warm
# parent (tests/torchrun.py, warm_launch): the ranks get torchrun's environment without four
# imports of torch a snippet; what torchrun itself does is tested in test_multiprocess.py.
TORCHRUN = {
    ("README.md", 1): 4,
    ("backends.md", 0): 4,
    ("multiprocess.md", 0): 4,
    ("quickstart.md", 0): 4,
    ("long_context.md", 0): 4,
}

_PRINT_CHECK = re.compile(r"^(\s*)print\((.*)\)\s*#\s*(.+)$")
CHECKER = """
def _check(value, text):
    norm = lambda s: "".join(str(s).replace(",", "").split())
    if not norm(text).startswith(norm(value)):
        raise AssertionError(f"the docs say this prints {text!r}; it prints {str(value)!r}")
    print(value)
"""


def snippets() -> list[tuple[str, int, str]]:
    out = []
    for path in DOCS:
        blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.MULTILINE | re.DOTALL)
        out += [(path.name, i, code) for i, code in enumerate(blocks)]
    return out


def with_checks(code: str) -> str:
    lines = []
    for line in code.splitlines():
        m = _PRINT_CHECK.match(line)
        lines.append(f"{m.group(1)}_check({m.group(2)}, {m.group(3)!r})" if m else line)
    return CHECKER + "\n".join(lines) + "\n"


def test_every_snippet_is_known_or_complete():
    found = {(name, i) for name, i, _ in snippets()}
    assert set(SETUP) <= found, f"setups for snippets that no longer exist: {sorted(set(SETUP) - found)}"
    assert len(found) >= 14
    assert IN_PROCESS <= found and not IN_PROCESS & set(TORCHRUN)


@pytest.mark.parametrize("name, index, code", snippets(), ids=lambda v: str(v)[:20] if not isinstance(v, str) else v)
def test_snippet_runs(name, index, code, tmp_path, request, monkeypatch):
    setup = SETUP.get((name, index), "")
    if setup is None:
        compile(code, f"{name}[{index}]", "exec")
        return
    if not HAS_TORCH_XLA and ("torch_xla" in setup + code or "enable_spmd()" in code):
        pytest.skip(NEEDS_TORCH_XLA)
    if (name, index) in IN_PROCESS:
        if HAS_TORCH_XLA:
            request.getfixturevalue("xla")
        monkeypatch.chdir(tmp_path)
        exec(compile(setup + with_checks(code), f"{name}[{index}]", "exec"), {"__name__": "__snippet__"})
        return
    script = tmp_path / "snippet.py"
    script.write_text(setup + with_checks(code))
    if (name, index) in TORCHRUN:
        run = warm_launch(script, TORCHRUN[(name, index)], cwd=tmp_path, timeout=300)
    else:
        command = [sys.executable, str(script)]
        run = subprocess.run(command, cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{name} snippet {index} failed:\n{run.stderr[-3000:]}"
