"""Norm-Explicit Quantization over PQ, OPQ, RQ and LSQ (docs/bench/quant.md)."""

from .neq import BASES, NEQIndex, faiss_baseline, make_quantizer_index, pad, padded_dim

__all__ = ["BASES", "NEQIndex", "faiss_baseline", "make_quantizer_index", "pad", "padded_dim"]
