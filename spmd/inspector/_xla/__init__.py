"""The torch_xla backend's capture (internal): turn on XLA's dumps, count steps at each
``torch_xla.sync()``, name tensors by module scopes, and read each compiled graph's memory and
collectives from the dumps. Its public paths are `spmd.inspector.capture` and
`spmd.inspector.dump`; the report, checks, runner and CLI it shares with the dry run are in
`spmd.inspector`."""
