"""Seeded DNA-like strings for the contract suite's string cases: clusters of mutated seeds,
so near neighbours exist at small edit distances."""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def strings(n: int = 3000, n_queries: int = 50, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """(base, queries) as object arrays of str over "acgt", 6 to 16 characters."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("acgt"))
    seeds = ["".join(rng.choice(letters, rng.integers(8, 15))) for _ in range(60)]

    def mutate(s: str) -> str:
        chars = list(s)
        for _ in range(int(rng.integers(0, 3))):
            op, pos = int(rng.integers(3)), int(rng.integers(len(chars) + 1))
            if op == 0 and len(chars) < 16:
                chars.insert(pos, str(rng.choice(letters)))
            elif op == 1 and len(chars) > 6 and pos < len(chars):
                del chars[pos]
            elif pos < len(chars):
                chars[pos] = str(rng.choice(letters))
        return "".join(chars)

    def draw(m: int) -> np.ndarray:
        out = np.empty(m, object)
        out[:] = [mutate(seeds[int(rng.integers(len(seeds)))]) for _ in range(m)]
        return out

    return draw(n), draw(n_queries)
