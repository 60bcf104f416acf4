"""The quantized graph of ip-NSW+ (``fast_scan=True``, docs/bench/graph.md, "The quantized
graph"): beside each node, its neighbours' 4-bit NEQ codes in the fast-scan block layout
(simsearch.quant.fastscan), so one expansion of the inner-product walk scores all of a node's
neighbours with one compiled block scan instead of one random row read each (SymphonyQG's idea,
over NEQ codes). Each node is scored exactly on its float vector as the walk expands it.

Every node owns ``ceil(width / 32)`` blocks at fixed places (node u's from block
``u * per_node``: the walk finds them without a lookup), so a write re-packs only the nodes whose
links changed; the walk scans the first ``ceil(degree / 32)`` of them. The blocks cover the
index's capacity, as its other per-item arrays do (untouched rows cost no memory).
"""

from __future__ import annotations

import numpy as np

from ..index import loads
from ..quant import NEQIndex
from ..quant import fastscan as FS

#: items needed before the codec is trained; smaller indexes walk on the vectors or sq8 codes
MIN_TRAIN = 256
_TRAIN_SAMPLE = 65_536
_CHUNK = 4096  # nodes packed at a time (bounds the temporary code gather)


def default_codebooks(dim: int) -> int:
    """Direction codebooks by default: one per two dimensions (at most 255), so a 4-bit
    code spends two bits a dimension."""
    return int(min(255, max(1, dim // 2)))


class QuantizedGraph:
    """The codec, every item's codes and every node's block of neighbour codes (positions
    as the index's). Mutated only under the index's write lock."""

    def __init__(self, codec: NEQIndex, width: int):
        self.codec = codec
        self.m = codec.n_direction_codebooks
        self.n_pairs = (self.m + 1) // 2
        self.per_node = -(-width // FS.BLOCK)
        self.stride = (self.n_pairs + 1) * FS.BLOCK
        self.codes = np.empty((0, self.m), np.uint8)
        self.norm_codes = np.empty(0, np.uint8)
        self.blocks = np.empty((0, self.stride), np.uint8)  # node u's: u * per_node..

    @classmethod
    def train(cls, x: np.ndarray, n_codebooks: int, width: int, seed: int) -> QuantizedGraph:
        rng = np.random.default_rng(seed)
        sample = x if len(x) <= _TRAIN_SAMPLE else x[rng.choice(len(x), _TRAIN_SAMPLE, False)]
        codec = NEQIndex(x.shape[1], "ip", base="pq", n_codebooks=n_codebooks + 1, nbits=4,
                         seed=seed, progress=False)  # fmt: skip
        codec.train(sample)
        return cls(codec, width)

    def grow(self, cap: int) -> None:
        for name, shape in (("codes", (cap, self.m)), ("norm_codes", (cap,)),
                            ("blocks", (cap * self.per_node, self.stride))):  # fmt: skip
            old = getattr(self, name)
            if old.shape[0] < shape[0]:
                new = np.zeros(shape, np.uint8)
                new[: old.shape[0]] = old
                setattr(self, name, new)

    def encode(self, x: np.ndarray, start: int) -> None:
        """Codes of the items at positions start.. (their rows of x)."""
        self.grow(start + len(x))
        c, nc = self.codec.encode(x)
        self.codes[start : start + len(x)] = c
        self.norm_codes[start : start + len(x)] = nc

    def repack(self, nodes: np.ndarray, links: np.ndarray, degree: np.ndarray) -> None:
        """Rebuild the blocks of ``nodes`` from their current links."""
        self.grow(int(nodes.max(initial=-1)) + 1)
        blocks = self.blocks.reshape(-1, self.per_node, self.stride)
        for s in range(0, len(nodes), _CHUNK):
            part = nodes[s : s + _CHUNK]
            deg = degree[part].astype(np.int64)
            rows = links[part]
            nbrs = rows[np.arange(rows.shape[1])[None, :] < deg[:, None]]
            # each node as a "list" padded to per_node blocks: pack lays lists out in order
            offsets = np.concatenate([[0], np.cumsum(deg)])
            packed = FS.pack(self.codes[nbrs], self.norm_codes[nbrs], offsets)
            out = np.zeros((len(part), self.per_node, self.stride), np.uint8)
            own = np.repeat(np.arange(len(part)), np.diff(packed.list_blocks))
            slot = np.arange(len(own)) - packed.list_blocks[own]
            out[own, slot] = packed.blocks
            blocks[part] = out

    def permuted(self, order: np.ndarray) -> QuantizedGraph:
        """A copy with the item at position ``order[i]`` at position i (i < len(order)), its
        blocks with it; the caller renumbers the links, whose order, and so the blocks' content,
        stays."""
        n = len(order)
        g = QuantizedGraph(self.codec, self.per_node * FS.BLOCK)
        g.codes, g.norm_codes, g.blocks = self.codes.copy(), self.norm_codes.copy(), \
            self.blocks.copy()
        g.codes[:n], g.norm_codes[:n] = self.codes[order], self.norm_codes[order]
        blocks = g.blocks.reshape(-1, self.per_node, self.stride)
        blocks[:n] = self.blocks.reshape(-1, self.per_node, self.stride)[order]
        return g

    def tables(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queries' 8-bit lookup tables, scales and biases (fastscan.quantize_luts)."""
        return FS.quantize_luts(self.codec.lookup_tables(q), self.n_pairs)

    def nbytes(self, n: int) -> int:
        """Bytes of the first n items' codes and blocks (the capacity beyond is untouched)."""
        return self.codes[:n].nbytes + self.norm_codes[:n].nbytes + \
            self.blocks[: n * self.per_node].nbytes

    def to_arrays(self, n: int) -> dict[str, np.ndarray]:
        return {"codec": np.frombuffer(self.codec.to_bytes(), np.uint8),
                "codes": self.codes[:n], "norm_codes": self.norm_codes[:n]}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], dim: int, width: int, links: np.ndarray,
                    degree: np.ndarray) -> QuantizedGraph:  # fmt: skip
        codec = loads(np.asarray(arrays["codec"], np.uint8).tobytes())
        if not isinstance(codec, NEQIndex) or codec.nbits != 4 or codec.dim != dim \
                or not codec.is_trained or codec.n_lists:
            raise ValueError("the quantized graph's codec is not a trained 4-bit NEQ quantizer "
                             "of the index's dimension")
        g = cls(codec, width)
        n = len(degree)
        codes = np.asarray(arrays["codes"], np.uint8)
        norm_codes = np.asarray(arrays["norm_codes"], np.uint8)
        if codes.shape != (n, g.m) or norm_codes.shape != (n,):
            raise ValueError("the quantized graph's codes do not match the items")
        if n and (int(codes.max()) > 15 or int(norm_codes.max()) > 15):
            raise ValueError("the quantized graph's codes are out of range")
        g.grow(n)
        g.codes[:n], g.norm_codes[:n] = codes, norm_codes
        g.repack(np.arange(n), links, degree)
        return g
