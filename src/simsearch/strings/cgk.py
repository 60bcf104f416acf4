"""The CGK embedding (Chakraborty, Goldenberg, Koucký 2016): a random walk that maps a string of
length at most M into Hamming space of length 3M, so that Hamming distance approximates edit
distance. The data-independent baseline of CNN-ED."""

from __future__ import annotations

import numpy as np

from .._kernels import topk_rows
from ..index import check_int
from . import _kernels as K
from ._alphabet import Alphabet, check_strings


class CGKEncoder:
    """CGK embedding over a fixed alphabet.

    Parameters
    ----------
    alphabet : the characters (None: learned by :meth:`fit`).
    max_len : longest string embedded (the paper's n); longer strings are truncated. The code
        has ``3 * max_len`` symbols.
    seed : seed of the random bits (the paper's shared random string r).

    >>> from simsearch.strings import CGKEncoder
    >>> enc = CGKEncoder(alphabet="acgt", max_len=8)
    >>> codes = enc.encode(["acgt", "acga", "tttt"])
    >>> codes.shape                                # 3 * max_len symbols each
    (3, 24)
    """

    def __init__(self, alphabet: str | None = None, max_len: int = 32, seed: int = 0):
        self.max_len = check_int("max_len", max_len, 1, 1 << 20)
        self.seed = check_int("seed", seed, 0)
        self.alphabet = Alphabet(alphabet) if alphabet is not None else None
        self._bits: np.ndarray | None = None
        if self.alphabet is not None:
            self._init_bits()

    @property
    def code_len(self) -> int:
        return 3 * self.max_len

    def _init_bits(self) -> None:
        rng = np.random.default_rng(self.seed)
        self._bits = rng.integers(0, 2, (self.code_len, len(self.alphabet) + 1), dtype=np.uint8)

    def fit(self, strings: list[str]) -> CGKEncoder:
        """Learn the alphabet from ``strings`` when none was given (CGK learns nothing else)."""
        strings = check_strings(strings)
        if self.alphabet is None:
            self.alphabet = Alphabet.from_strings(strings)
            self._init_bits()
        return self

    def encode(self, strings: list[str]) -> np.ndarray:
        """CGK codes uint8 (n, 3 * max_len); compare them by Hamming distance."""
        strings = check_strings(strings)
        if self.alphabet is None:
            self.fit(strings)
        codes, lengths = self.alphabet.encode(strings, self.max_len)
        out = np.empty((len(strings), self.code_len), np.uint8)
        K.cgk_embed(codes, lengths, self._bits, out)
        return out


def hamming_search(xq: np.ndarray, xb: np.ndarray, k: int, block: int = 64):
    """Exact top-k rows of ``xb`` by Hamming distance for each row of ``xq`` (uint8 codes), ties
    by smaller row. Returns (ids int64 (nq, k'), distances int32 (nq, k')), k' = min(k, n)."""
    xq = np.ascontiguousarray(xq, np.uint8)
    xb = np.ascontiguousarray(xb, np.uint8)
    k = min(check_int("k", k, 1), xb.shape[0])
    nq = xq.shape[0]
    ids = np.empty((nq, k), np.int64)
    dists = np.empty((nq, k), np.int32)
    buf = np.empty((min(block, max(nq, 1)), xb.shape[0]), np.int32)
    for s in range(0, nq, block):
        e = min(s + block, nq)
        d = buf[: e - s]
        K.hamming_distances(xq[s:e], xb, d)
        ids[s:e], dists[s:e] = smallest_k(d, k)
    return ids, dists


def smallest_k(d: np.ndarray, k: int):
    """Smallest min(k, n) per row of an integer matrix (b, n), ties by column: positions int64
    and their values (d's dtype), smallest first. The one heap of every top-k
    (simsearch._kernels.topk_rows; distances here are far below float32's 2**24)."""
    n = d.shape[1]
    pos, vals = topk_rows(d.astype(np.float32), min(k, n), -1.0, np.arange(n, dtype=np.int64))
    return pos, vals.astype(d.dtype)
