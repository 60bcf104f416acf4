"""Norm-Explicit Quantization over PQ, OPQ, RQ and LSQ (design §4.2)."""

from .neq import BASES, NEQIndex, faiss_baseline, make_quantizer_index, pad, padded_dim

__all__ = ["BASES", "NEQIndex", "faiss_baseline", "make_quantizer_index", "pad", "padded_dim"]
