"""4-bit fast-scan for NEQ: the block layout, the 8-bit lookup tables and the scan (compiled in
csrc/, the numba version in ``_kernels.fastscan_reference`` is the reference it must equal).

Items of each inverted list sit in blocks of 32. A block holds, for each pair of direction
sub-quantizers (2p, 2p + 1), 32 bytes: byte 2j packs item j's two 4-bit codes (low nibble: 2p),
byte 2j + 1 item 16 + j's; then the 32 items' norm codes. A shuffle of 32 bytes (pshufb) looks a
table up for all 32 items at once, and summing the result as 16-bit lanes keeps items j and
16 + j apart without unpacking (docs/kernels.md). The estimate of <q, x> is

    norm_codebook[norm code] * (scale * sum_m lut8_m[c_m] + bias)

with each query's float tables quantized to 8 bits: one shared scale, a bias per table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _simd
from . import _kernels as K

BLOCK = 32


@dataclass(frozen=True)
class Blocks:
    """Codes of items grouped by list, in the block layout."""

    blocks: np.ndarray  # uint8 (n_blocks, 32 * n_pairs + 32)
    list_blocks: np.ndarray  # int64 (n_lists + 1,)
    block_base: np.ndarray  # int64 (n_blocks,): position of each block's item 0
    block_count: np.ndarray  # uint8 (n_blocks,)

    @property
    def n_pairs(self) -> int:
        return self.blocks.shape[1] // BLOCK - 1

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.blocks, self.list_blocks, self.block_base,
                                      self.block_count))  # fmt: skip


def pack(codes: np.ndarray, norm_codes: np.ndarray, offsets: np.ndarray) -> Blocks:
    """Blocks of items stored grouped by list (list l: positions offsets[l]:offsets[l + 1]);
    ``codes`` uint8 (n, M - 1) with values < 16, ``norm_codes`` uint8 (n,) < 16."""
    n, md = codes.shape
    counts = np.diff(offsets)
    per_list = -(-counts // BLOCK)
    list_blocks = np.concatenate([[0], np.cumsum(per_list)]).astype(np.int64)
    nb = int(list_blocks[-1])
    owner = np.repeat(np.arange(len(counts)), per_list)
    t = np.arange(nb) - list_blocks[owner]
    block_base = (offsets[owner] + BLOCK * t).astype(np.int64)
    block_count = np.minimum(BLOCK, counts[owner] - BLOCK * t).astype(np.uint8)
    slot = block_base[:, None] + np.arange(BLOCK)
    valid = np.arange(BLOCK) < block_count[:, None].astype(np.int64)
    slot = np.where(valid, slot, 0)
    n_pairs = (md + 1) // 2
    c = np.zeros((nb, BLOCK, 2 * n_pairs), np.uint8)
    if n:
        c[:, :, :md] = np.where(valid[:, :, None], codes[slot], 0)
    val = c[:, :, 0::2] | (c[:, :, 1::2] << 4)  # (nb, 32, n_pairs)
    out = np.empty((nb, n_pairs + 1, BLOCK), np.uint8)
    out[:, :n_pairs, 0::2] = val[:, :16].transpose(0, 2, 1)
    out[:, :n_pairs, 1::2] = val[:, 16:].transpose(0, 2, 1)
    out[:, n_pairs] = np.where(valid, norm_codes[slot] if n else 0, 0)
    return Blocks(out.reshape(nb, (n_pairs + 1) * BLOCK), list_blocks, block_base, block_count)


def unpack(b: Blocks, n: int, n_codes: int) -> np.ndarray:
    """The direction codes back, uint8 (n, n_codes), by position."""
    nb, p = b.blocks.shape[0], b.n_pairs
    raw = b.blocks.reshape(nb, p + 1, BLOCK)[:, :p]
    val = np.empty((nb, BLOCK, p), np.uint8)
    val[:, :16] = raw[:, :, 0::2].transpose(0, 2, 1)
    val[:, 16:] = raw[:, :, 1::2].transpose(0, 2, 1)
    c = np.empty((nb, BLOCK, 2 * p), np.uint8)
    c[:, :, 0::2], c[:, :, 1::2] = val & 15, val >> 4
    valid = np.arange(BLOCK) < b.block_count[:, None].astype(np.int64)
    pos = (b.block_base[:, None] + np.arange(BLOCK))[valid]
    out = np.empty((n, n_codes), np.uint8)
    out[pos] = c[valid][:, :n_codes]
    return out


def quantize_luts(
    lut: np.ndarray, n_pairs: int, n_threads: int = 1, reference: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float tables (nq, M - 1, 16) -> (uint8 (nq, 2 * n_pairs, 16), scale (nq,), bias (nq,))
    with sum_m lut[m, c_m] ~= scale * sum_m lut8[m, c_m] + bias: one scale per query, the
    tables' minima as the bias. A missing table of an odd count is all zeros. Compiled (numpy's
    passes over the tables cost a sixth of a 300-d search); ``reference`` runs numpy."""
    nq, md, _ = lut.shape
    if not reference:
        q8 = np.empty((nq, 2 * n_pairs, 16), np.uint8)
        scale, bias = np.empty(nq, np.float32), np.empty(nq, np.float32)
        _simd.quantize_luts(np.ascontiguousarray(lut, np.float32), q8, scale, bias, n_threads)
        return q8, scale, bias
    lo = lut.min(axis=2, keepdims=True)
    span = lut - lo
    scale = np.maximum(span.max(axis=(1, 2)), np.float32(1e-30)) / np.float32(255.0)
    q8 = np.zeros((nq, 2 * n_pairs, 16), np.uint8)
    q8[:, :md] = np.rint(span / scale[:, None, None]).astype(np.uint8)
    bias = lo.sum(axis=(1, 2), dtype=np.float64).astype(np.float32)
    return q8, scale.astype(np.float32), bias


def scan(b: Blocks, luts: np.ndarray, scale: np.ndarray, bias: np.ndarray,
         norm_codebook: np.ndarray, k: int, probes: np.ndarray | None, ordered: bool,
         n_threads: int = 1, reference: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The best ``k`` estimates per query over the probed lists (all with ``probes=None``):
    positions int64 (nq, k) (-1 padding) and float32 estimates. ``reference`` runs the numba
    version instead of the compiled one."""
    nq = luts.shape[0]
    pr = np.empty((nq, 0), np.int64) if probes is None else np.ascontiguousarray(probes, np.int64)
    cb = np.ascontiguousarray(norm_codebook, np.float32)
    if reference:
        return K.fastscan_reference(b.blocks, b.list_blocks, b.block_base, b.block_count, pr,
                                    luts, scale, bias, cb, k)  # fmt: skip
    pos = np.empty((nq, k), np.int64)
    sc = np.empty((nq, k), np.float32)
    _simd.fastscan(b.blocks, b.list_blocks, b.block_base, b.block_count, pr, luts, scale, bias,
                   cb, pos, sc, ordered, n_threads)  # fmt: skip
    return pos, sc


def rerank(cand: np.ndarray, x: np.ndarray, q: np.ndarray, k: int,
           n_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The best k of each row's candidate positions (-1 skipped) by exact inner product, best
    first: positions int64 (nq, k) (-1 padding) and float32 scores. Compiled, rows prefetched
    ahead (the reference is ``_kernels.rerank_batch``)."""
    pos = np.empty((q.shape[0], k), np.int64)
    sc = np.empty((q.shape[0], k), np.float32)
    _simd.rerank(np.ascontiguousarray(cand, np.int64), x, np.ascontiguousarray(q, np.float32),
                 pos, sc, n_threads)  # fmt: skip
    return pos, sc
