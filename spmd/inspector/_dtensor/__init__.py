"""The DTensor backend's capture (internal): run a script as one rank of an N-rank job on
torch.distributed's fake process group and fake tensors, and record each step's memory by
category and every collective. Reached through ``python -m spmd.inspector --world N``; the
report, checks, runner and CLI it shares with the torch_xla backend are in `spmd.inspector`."""
