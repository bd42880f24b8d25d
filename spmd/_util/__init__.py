"""Private plumbing shared by the packages: atomic writes, regular-file reads, CLI argument
types and the torch-release differences (`torch_compat`). Not part of the public API."""
