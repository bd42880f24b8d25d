"""Enumerating every partition spec of a mesh, for the conformance tests."""

from __future__ import annotations

import itertools

import numpy as np

from mesh import Mesh

MESH_SHAPES = [(8,), (2, 4), (4, 2), (1, 8), (8, 1), (2, 2, 2), (2, 1, 4), (4, 2, 1), (1, 2, 4)]
PERMUTED_IDS = np.array([3, 1, 0, 2, 7, 5, 4, 6])


def make_mesh(shape, permuted: bool = False) -> Mesh:
    ids = PERMUTED_IDS if permuted else np.arange(8)
    return Mesh(ids, shape, tuple("xyz"[: len(shape)]))


def all_specs(ndim: int, rank: int, by_index: bool = False):
    """Every full-rank spec: each mesh axis goes to one tensor dim (in every order) or none."""
    for placement in itertools.product(range(-1, rank), repeat=ndim):
        per_dim = [[a for a in range(ndim) if placement[a] == d] for d in range(rank)]
        for orders in itertools.product(*[list(itertools.permutations(axes)) for axes in per_dim]):
            spec = []
            for axes in orders:
                labels = tuple(a if by_index else "xyz"[a] for a in axes)
                spec.append(None if not labels else labels[0] if len(labels) == 1 else labels)
            yield tuple(spec)
