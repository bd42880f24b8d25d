"""Files, written and read safely: public for ``fsdp_xla`` (checkpoints, the consolidation CLI,
the Hugging Face config) and the tools.

- `atomic_write`, `file_to_write`: write a file so that its name never shows a half-written file.
- `read_regular_file`: read a small file a user named, refusing a directory, a FIFO or a file
  over a size bound.
- `input_file`, `output_file`, `output_dir`: argparse types that check a path before any work.

The implementation lives in ``spmd._util`` (private).
"""

from spmd._util.atomic_file import atomic_write as atomic_write
from spmd._util.atomic_file import file_to_write as file_to_write
from spmd._util.cli_args import input_file as input_file
from spmd._util.cli_args import output_dir as output_dir
from spmd._util.cli_args import output_file as output_file
from spmd._util.regular_file import read_regular_file as read_regular_file

__all__ = ["atomic_write", "file_to_write", "input_file", "output_dir", "output_file", "read_regular_file"]
