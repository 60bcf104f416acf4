"""Norm-Explicit Quantization over PQ, OPQ, RQ and LSQ (design §4.2)."""
