"""Small training scripts for the dry run's tests, each written to a file: one FSDP2 model on
all ranks, AdamW, three steps, with a few lines of the test's put before, in or after the loop."""

from pathlib import Path

TRAIN = """\
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
fully_shard(model, mesh=mesh)
{before}
optimizer = torch.optim.AdamW(model.parameters())


def batches():
    for _ in range(3):
        yield torch.randn(8, 16)


def train(data):
    for step, x in enumerate(data):
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
{inside}


if __name__ == "__main__":
{main}
"""


def indent(lines: str, spaces: int) -> str:
    return "".join(" " * spaces + line + "\n" for line in lines.strip("\n").splitlines())


def write_script(
    folder: Path, name: str, *, before: str = "", inside: str = "", main: str = "train(batches())"
) -> Path:
    """``folder/name``: the training script with ``before`` (after the model is built, before the
    optimizer), ``inside`` (the end of each step, where ``step`` and ``loss`` are set) and
    ``main`` (what runs as ``__main__``)."""
    path = folder / name
    path.write_text(TRAIN.format(before=before, inside=indent(inside, 8), main=indent(main, 4)))
    return path


def line_of(path: Path, text: str) -> str:
    """``'path:N'``: where ``text`` (a whole line, stripped) is in the script."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return f"{path}:{lines.index(text) + 1}"
