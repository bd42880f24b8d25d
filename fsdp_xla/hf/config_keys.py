"""The keys of the Hugging Face Trainer's ``fsdp_config``: the ones fsdp_xla maps to its options,
and the ones that mean nothing on GSPMD, each with the reason `read_fsdp_config` reports."""

from __future__ import annotations

__all__ = ["IGNORED_KEYS", "IGNORED_XLA_SETTINGS", "MAPPED_KEYS", "MAPPED_SETTINGS"]

# Top-level keys (after the Trainer strips the ``fsdp_`` prefix) that configure PyTorch's
# CUDA FSDP through accelerate and mean nothing for XLA FSDP on GSPMD.
IGNORED_KEYS: dict[str, str] = {
    "version": "selects torch FSDP1/FSDP2 on GPUs; fsdp_xla is one implementation",
    "cpu_offload": "offloads to CPU memory on GPUs; not supported on XLA devices",
    "cpu_ram_efficient_loading": "loads pretrained weights on rank 0 only; use fsdp_xla.deferred_init to build "
    "models larger than host memory",
    "state_dict_type": "torch FSDP state-dict mode; fsdp_xla keeps parameter names, and sharded checkpoints are "
    "fsdp_xla.checkpoint.save_sharded",
    "backward_prefetch": "CUDA stream prefetching; XLA schedules collectives itself",
    "forward_prefetch": "CUDA stream prefetching; XLA schedules collectives itself",
    "limit_all_gathers": "CUDA caching-allocator throttle; XLA plans memory at compile time",
    "use_orig_params": "fsdp_xla always keeps the original parameters",
    "sync_module_states": "GSPMD runs one program over all devices: there is nothing to broadcast",
    "xla_fsdp_v2": "fsdp_xla is built on GSPMD; there is no v1/v2 choice to make",
}

# Settings of torch_xla's XlaFullyShardedDataParallel (``xla_fsdp_settings``) that describe
# hand-written collectives or flattening, which GSPMD does not have.
IGNORED_XLA_SETTINGS: dict[str, str] = {
    "flatten_parameters": "GSPMD shards each parameter as it is; nothing is flattened",
    "execute_sharding_on_init": "fsdp_xla shards parameters when it wraps the model",
    "pin_layout_in_collective_ops": "GSPMD inserts the collectives and XLA chooses their layouts",
    "disable_reshard_on_root": "the root unit is resharded like the others (reshard_after_forward)",
    "sharding_groups": "the fsdp mesh axis defines the groups",
    "sharding_rank": "the fsdp mesh axis defines the groups",
    "sharding_world_size": "the fsdp mesh axis defines the groups",
    "reduce_scatter_bucket_size_mb": "XLA combines collectives itself",
    "coalesce_all_gather_ops": "XLA combines collectives itself",
    "_shard_size_multiple": "GSPMD pads shards itself",
    "_use_xla_patched_linear": "fsdp_xla regathers weights for backward through saved-tensor hooks",
    "_debug_dummy_forward_pass": "a torch_xla FSDP v1 debugging switch",
    "_debug_msg": "a torch_xla FSDP v1 debugging switch",
    "_debug_print": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_all_gather_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_all_reduce_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_reduce_scatter_op": "a torch_xla FSDP v1 debugging switch",
    "_debug_dummy_optimization_barrier_op": "a torch_xla FSDP v1 debugging switch",
}

MAPPED_KEYS = {
    "xla",
    "xla_fsdp_settings",
    "xla_fsdp_grad_ckpt",
    "transformer_layer_cls_to_wrap",
    "min_num_params",
    "auto_wrap_policy",
    "reshard_after_forward",
    "activation_checkpointing",
}
MAPPED_SETTINGS = {
    "compute_dtype",
    "buffer_dtype",
    "fp32_reduce_scatter",
    "reshard_after_forward",
    "optimization_barrier_in_forward",
    "optimization_barrier_in_backward",
    "shard_param_on_dim_0",
    "sync_on_finalization",
}
