"""String collections for the node service (docs/service.md, "String collections"): kind
"strings", metric "edit", items are strings, results carry exact edit distances.

``StringCollectionIndex`` gives a :class:`StringIndex` the surface the service's store drives
(train, add, remove, search, contains, save/load). It is trained once, either by fitting a CNN-ED
encoder on the strings of a Train call or from an already trained encoder's file; the store
snapshots it right after, so recovery never re-trains.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from ..errors import (
    CorruptIndexError,
    InvalidParameterError,
    NotTrainedError,
    RetrainNonEmptyError,
)
from ..fileformat import read_index_file, write_index_file
from ..index import SearchResult, as_id_array, create_index
from ._alphabet import check_strings
from .string_index import PAD_DISTANCE, StringIndex

KIND = "strings"
METRIC = "edit"
_UNTRAINED_CLASS = "string-collection"
#: CNNEDEncoder constructor parameters a collection may set (``params["encoder"]``)
ENCODER_PARAMS = frozenset({"alphabet", "max_len", "embed_dim", "n_layers", "channels",
                            "global_channels", "profile", "seed"})
#: CNNEDEncoder.fit parameters a Train call may pass
FIT_PARAMS = frozenset({"epochs", "batch_size", "n_train", "n_neighbors", "neighbours",
                        "n_candidates", "n_pool", "learning_rate", "early_stopping",
                        "validation_fraction", "approx_form", "far_fraction", "n_threads"})


class StringCollectionIndex:
    """A string collection's index: ``index`` (the vector index kind over the embeddings, metric
    "l2"), its build parameters, and ``encoder`` (CNNEDEncoder parameters for training here)."""

    kind: ClassVar[str] = KIND
    needs_training: ClassVar[bool] = True
    supports_remove: ClassVar[bool] = True
    search_params: ClassVar[frozenset[str]] = frozenset({"n_candidates", "ef", "n_threads"})

    def __init__(self, dim: int = 0, metric: str = METRIC, index: str = "hnsw",
                 encoder: dict | None = None, **index_params: Any):
        if metric != METRIC:
            raise InvalidParameterError(
                f"a string collection's metric is {METRIC!r} (edit distance); got {metric!r}")
        encoder = dict(encoder or {})
        unknown = set(encoder) - ENCODER_PARAMS
        if unknown:
            raise InvalidParameterError(
                f"unknown encoder parameter(s) {sorted(unknown)}; "
                f"allowed: {sorted(ENCODER_PARAMS)}")
        create_index(index, 8, "l2", **index_params)  # checks the vector index parameters
        self.index_kind, self.index_params, self.encoder_params = index, index_params, encoder
        self.strings: StringIndex | None = None

    @property
    def is_trained(self) -> bool:
        return self.strings is not None

    def __len__(self) -> int:
        return 0 if self.strings is None else len(self.strings)

    @property
    def next_id(self) -> int:
        """The first id an ``add`` without ids gives."""
        return 0 if self.strings is None else self.strings.next_id

    def _trained(self) -> StringIndex:
        if self.strings is None:
            raise NotTrainedError("a string collection must be trained (its CNN-ED encoder fit, "
                                  "or an encoder file given) before add() or search()")
        return self.strings

    # -- training ---------------------------------------------------------------------------

    def train(self, texts: Any = None, encoder_file: bytes | None = None, **fit_params: Any):
        """Fit a CNN-ED encoder on ``texts``, or take a trained one from ``encoder_file`` (the
        bytes of ``CNNEDEncoder.save``). Refused once the collection holds strings."""
        from .encoder import CNNEDEncoder

        if len(self):
            raise RetrainNonEmptyError(
                f"the string collection holds {len(self)} strings; a new encoder would not "
                "match their embeddings. Remove them first, or create a new collection")
        unknown = set(fit_params) - FIT_PARAMS
        if unknown:
            raise InvalidParameterError(
                f"unknown training parameter(s) {sorted(unknown)}; allowed: {sorted(FIT_PARAMS)}")
        if encoder_file:
            try:
                enc = CNNEDEncoder.loads(encoder_file)
            except CorruptIndexError:  # the caller's bytes, not a damaged store
                raise InvalidParameterError(
                    f"encoder must be the file CNNEDEncoder.save writes; got "
                    f"{len(encoder_file)} bytes that are not one") from None
        else:
            texts = check_strings(texts, "training strings")
            enc = CNNEDEncoder(**self.encoder_params).fit(texts, progress=False, **fit_params)
        self.strings = StringIndex(enc, self.index_kind, **self.index_params)

    # -- items ------------------------------------------------------------------------------

    def add(self, texts: Any, ids: Any = None) -> np.ndarray:
        return self._trained().add(check_strings(texts), ids)

    def remove(self, ids: Any) -> int:
        return self._trained().remove(ids) if self.strings is not None else 0

    def contains(self, ids: Any) -> np.ndarray:
        ids = as_id_array(ids)
        if self.strings is None:
            return np.zeros(ids.shape, bool)
        return self.strings.contains(ids)

    def ids(self) -> np.ndarray:
        """The ids stored, sorted."""
        return np.empty(0, np.int64) if self.strings is None else self.strings.ids()

    def search(self, q: Any, k: int, allow: Any = None, deny: Any = None,
               **params: Any) -> SearchResult:
        """Top-k by exact edit distance; scores are the distances (float32, +inf padding)."""
        unknown = set(params) - self.search_params
        if unknown:
            raise InvalidParameterError(
                f"unknown search parameter(s) {sorted(unknown)} for a string collection; "
                f"allowed: {sorted(self.search_params)}")
        res = self._trained().search(check_strings(q, "queries"), k, allow=allow,
                                     deny=deny, **params)
        scores = res.distances.astype(np.float32)
        scores[res.distances == PAD_DISTANCE] = np.inf
        return SearchResult(res.ids, scores)

    # -- persistence ------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        if self.strings is not None:
            self.strings.save(path)
            return
        write_index_file(path, {"class": _UNTRAINED_CLASS, "params": self.params()}, {})

    def params(self) -> dict:
        return {"index": self.index_kind, "encoder": self.encoder_params, **self.index_params}

    @classmethod
    def load(cls, path: str | os.PathLike, params: dict) -> StringCollectionIndex:
        """Restore a snapshot of a collection built with ``params``."""
        header, _ = read_index_file(path)
        obj = cls(**params)
        if header.get("class") != _UNTRAINED_CLASS:
            obj.strings = StringIndex.load(path)
        return obj


def to_distances(scores: np.ndarray) -> np.ndarray:
    """Scores of a string search (float, +inf padding) back to int32 edit distances."""
    out = np.full(scores.shape, PAD_DISTANCE, np.int32)
    ok = np.isfinite(scores)
    out[ok] = scores[ok].astype(np.int32)
    return out
