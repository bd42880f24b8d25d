"""FSDP on GSPMD for PyTorch/XLA (parameters sharded on an ``fsdp`` mesh axis); built in issue 4."""

__all__: list[str] = []
