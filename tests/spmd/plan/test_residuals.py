"""`spmd.plan.lower.residuals.saved_residuals`: the block scan is the one run in its scope,
whatever other scans of the step have as many trips (no compile: a traced jaxpr)."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from spmd.plan.lower.residuals import SavedActivation, in_layer_scan, saved_residuals  # noqa: E402

LAYERS, WIDTH, TOKENS = 3, 8, 4


def _block(carry, weight):
    from jax.ad_checkpoint import checkpoint_name

    projected = checkpoint_name(carry @ weight, "query_proj")
    return jnp.tanh(projected)


def _step(stack_scope: bool, tiles: bool = True):
    """A loss with a block scan (keeping its input and one named [TOKENS, WIDTH] array a layer),
    then, with ``tiles``, a second scan of as many trips, like vocabulary tiling with as many
    tiles, that stacks residuals of its own."""
    policy = jax.checkpoint_policies.save_only_these_names("query_proj")
    block = jax.checkpoint(_block, policy=policy)

    def loss(weights, head, x):
        def layers(c, w):
            return block(c, w), None

        if stack_scope:
            with in_layer_scan():
                h, _ = jax.lax.scan(layers, x, weights)
        else:
            h, _ = jax.lax.scan(layers, x, weights)

        def tile(total, w):
            return total + jnp.sin(h @ w).sum(), None

        if not tiles:
            return h.sum()
        total, _ = jax.lax.scan(tile, 0.0, head)
        return total

    weights = jnp.ones((LAYERS, WIDTH, WIDTH))
    head = jnp.ones((LAYERS, WIDTH, 2))  # as many tiles as layers
    x = jnp.ones((TOKENS, WIDTH))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).trace(weights, head, x).jaxpr.jaxpr


def test_the_block_scans_residuals_are_its_own_whatever_else_the_step_scans():
    saved = saved_residuals(_step(stack_scope=True))
    # the layer input (for the weight's gradient) and query_proj (the policy's name), a layer each
    assert saved == (SavedActivation((TOKENS, WIDTH), "float32"),) * 2
    assert saved_residuals(_step(stack_scope=True, tiles=False)) == saved


def _forward_scans_of_the_stacks_length(jaxpr) -> list:
    from spmd.plan._jax_compat import scan_stacked_outputs

    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan" and eqn.params["length"] == LAYERS and not eqn.params["reverse"]:
            found.append(len(scan_stacked_outputs(eqn)))
    return found


def test_a_scan_of_the_same_length_outside_the_scope_is_not_the_block_scan():
    # the premise: the tiling scan stacks residuals of its own (what sin's gradient needs), so a
    # match by length would have counted them as the block's
    assert _forward_scans_of_the_stacks_length(_step(stack_scope=True)) == [2, 1]
    assert saved_residuals(_step(stack_scope=False)) == ()
