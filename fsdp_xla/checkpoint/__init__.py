"""Sharded checkpoints: each device's shards in safetensors files, a JSON index, atomic saves.

Layout of a checkpoint directory::

    ckpt/
      LATEST                      the name of the complete version below (replaced atomically)
      v-20261122T081500-3f2a9c1e/
        index.json                every tensor: global shape, dtype, where each block lives
        device-00000.safetensors  the blocks device 0 holds (one copy of each replicated block)
        ...

A save writes a new version directory, syncs it to disk, then replaces ``LATEST`` with a
rename, the one atomic step; older versions of its own lineage are removed after (the versions
its run wrote or resumed from, never another run's: `_lineage`). A save killed at any point, or
stopped by a full disk (then a `CheckpointError`), leaves ``LATEST`` naming the previous
complete version. Saves into one directory take an exclusive lock on ``<dir>/.lock`` and so run
one after the other; loads take it shared, so no version is removed while it is being read.

Loading reads only safetensors and JSON (no pickle, so no code runs), and only files inside the
checkpoint: ``LATEST`` and every file named in ``index.json`` must be names the writer makes,
nothing inside the root is followed through a symbolic link, and the whole index is checked
before any tensor is read (`_format`, `_files`). Every block is verified (checksum, dtype, shape)
before any parameter or optimizer state is written, so a refused load leaves both as they were
(`_load`). Each tensor is assembled on the host and laid out as the model's current sharding, so a
checkpoint saved on 8 devices loads on 4 (or on any mesh, on either backend). Files are written
with mode 0644.

The modules, by job: `_arguments` (the functions' arguments, checked before anything is read
or written), `_format` (names, dtypes, the index check, checksums), `_files` (the directory:
lock, LATEST, versions, pruning, reading), `_lineage` (whose versions a save may remove),
`_save`, `_load`, `_optimizer` (optimizer state by parameter name), `_dtensor` (each rank's
blocks on the DTensor backend).
"""

from fsdp_xla.checkpoint._files import LATEST, checkpoint_version, has_checkpoint
from fsdp_xla.checkpoint._format import FORMAT, is_version_name
from fsdp_xla.checkpoint._load import consolidate, load_sharded
from fsdp_xla.checkpoint._save import save_sharded
from fsdp_xla.errors import CheckpointError as CheckpointError  # its home is fsdp_xla.errors

__all__ = [
    "FORMAT",
    "LATEST",
    "checkpoint_version",
    "consolidate",
    "has_checkpoint",
    "is_version_name",
    "load_sharded",
    "save_sharded",
]
