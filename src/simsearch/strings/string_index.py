"""StringIndex: edit-distance search over strings, an ordinary index kind ("strings", metric
"edit", dim 0). Embed with a CNN-ED encoder, take the T nearest embeddings from a vector index
(metric "l2"), re-rank them by exact edit distance; scores are the edit distances, smallest
first (docs/service.md, "String collections")."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np

from ..capabilities import Capabilities
from ..errors import CorruptIndexError, InvalidParameterError, NotTrainedError, UnknownIdError
from ..filters import IdFilter
from ..index import (
    Index,
    SearchResult,
    as_id_array,
    check_int,
    check_threads,
    create_index,
    register,
)
from ..index import loads as loads_vector_index
from ._alphabet import string_batch
from .brute import distances_with_cutoff
from .encoder import CNNEDEncoder

RERANK_BLOCK = 128  # candidates scored per cdist call; the cutoff tightens in between
#: CNNEDEncoder constructor parameters an index may set (``encoder=``)
ENCODER_PARAMS = frozenset({"alphabet", "max_len", "embed_dim", "n_layers", "channels",
                            "global_channels", "profile", "seed"})
#: CNNEDEncoder.fit parameters ``train`` takes
FIT_PARAMS = frozenset({"epochs", "batch_size", "n_train", "n_neighbors", "neighbours",
                        "n_candidates", "n_pool", "learning_rate", "early_stopping",
                        "validation_fraction", "approx_form", "far_fraction", "n_threads"})
#: files of the kind before it was one: a trained StringIndex, an untrained collection's index
_LEGACY_CLASSES = ("string-index", "string-collection")


@register("strings")
class StringIndex(Index):
    """Nearest strings by edit distance, through CNN-ED embeddings and exact re-ranking.

    Parameters
    ----------
    dim : 0 (items are strings, not vectors).
    metric : "edit".
    index : vector index kind holding the embeddings under metric "l2" ("hnsw", "flat", ...).
    encoder : a trained :class:`CNNEDEncoder` (the index is trained at once), or the
        CNNEDEncoder parameters ``train`` fits one with (a dict).
    **index_params : build parameters of that vector index (e.g. ``M``, ``ef_construction``).

    ``train(strings, **fit_params)`` fits the encoder (CNNEDEncoder.fit's parameters), or
    ``train(None, encoder_file=bytes)`` takes a trained one's file. Search parameters, per call:
    ``n_candidates`` (the paper's T: embedding-nearest candidates re-ranked by exact edit
    distance, default max(k, 1024)), ``ef`` (HNSW beam, raised to T), ``n_threads``.

    >>> from simsearch.strings import CNNEDEncoder, StringIndex
    >>> enc = CNNEDEncoder(alphabet="abc", max_len=8, embed_dim=8)
    >>> enc = enc.fit(["abc", "cab", "bca", "aab", "bbc", "cca"] * 4, epochs=1,
    ...               progress=False)
    >>> idx = StringIndex(encoder=enc, index="flat")
    >>> idx.add(["abc", "abcc", "cba"]).tolist()
    [0, 1, 2]
    >>> r = idx.search(["abc"], k=2)
    >>> r.ids.tolist(), r.scores.tolist()
    ([[0, 1]], [[0.0, 1.0]])
    """

    metrics: ClassVar[tuple[str, ...]] = ("edit",)
    capabilities = Capabilities(
        items="strings", needs_training=True,
        search_params=frozenset({"n_candidates", "ef", "n_threads"}),
        train_options=FIT_PARAMS | {"encoder_file"},
        train_logged=False)  # a fit is slow: a node snapshots it instead

    def __init__(self, dim: int = 0, metric: str = "edit", index: str = "hnsw",
                 encoder: CNNEDEncoder | dict | None = None, **index_params: Any):
        trained = encoder if isinstance(encoder, CNNEDEncoder) else None
        if trained is not None:
            if not trained.is_trained:
                raise NotTrainedError("the encoder must be fit() (or loaded) first")
            encoder = {}
        encoder = dict(encoder or {})
        unknown = set(encoder) - ENCODER_PARAMS
        if unknown:
            raise InvalidParameterError(f"unknown encoder parameter(s) {sorted(unknown)}; "
                                        f"allowed: {sorted(ENCODER_PARAMS)}")
        create_index(index, 8, "l2", **index_params)  # checks the vector index's parameters
        super().__init__(dim, metric, index=index, encoder=encoder, **index_params)
        self.index_kind, self.index_params = index, dict(index_params)
        self.encoder: CNNEDEncoder | None = None
        self._vectors: Index | None = None
        self._strings: dict[int, str] = {}
        if trained is not None:
            self._train(trained)
            self._is_trained = True

    def __repr__(self) -> str:
        return f"StringIndex(index={self.index_kind!r}, encoder={self.encoder!r}) n={len(self)}"

    def check_items(self, x: Any, what: str = "strings") -> np.ndarray:
        """A str is one item; else a list (or array) of str, as an object array."""
        return string_batch(x, what)

    def item_bytes(self, x: np.ndarray) -> bytes:
        return json.dumps(list(x)).encode()

    def items_from_bytes(self, blob: bytes) -> np.ndarray:
        return self.check_items(json.loads(blob))

    # -- training ---------------------------------------------------------------------------

    def _learn(self, x: np.ndarray, encoder_file: bytes | None = None,
               **fit_params: Any) -> CNNEDEncoder:
        if encoder_file is not None:
            try:
                return CNNEDEncoder.loads(encoder_file)
            except CorruptIndexError:  # the caller's bytes, not a damaged store
                raise InvalidParameterError(
                    f"encoder_file must be the bytes CNNEDEncoder.save writes; got "
                    f"{len(encoder_file)} bytes that are not one") from None
        super()._learn(x)  # at least one string
        return CNNEDEncoder(**self._params["encoder"]).fit(x.tolist(), progress=False,
                                                           **fit_params)

    def train(self, x: Any = None, **options: Any) -> None:
        """Fit the encoder on strings ``x``, or (``x`` None) take ``encoder_file``."""
        super().train([] if x is None else x, **options)

    def _train(self, encoder: CNNEDEncoder) -> None:
        self.encoder = encoder
        self._vectors = create_index(self.index_kind, encoder.dim, "l2", **self.index_params)
        self._strings = {}

    # -- items ------------------------------------------------------------------------------

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        texts = x.tolist()
        self._vectors.add(self.encoder.encode(texts), ids)  # an unknown character: refused here
        self._strings.update(zip(ids.tolist(), texts, strict=True))

    def _remove(self, ids: np.ndarray) -> None:
        self._vectors.remove(ids)
        for i in ids.tolist():
            del self._strings[i]

    def get_strings(self, ids: Any) -> list[str]:
        """The stored strings of ``ids``, in the order given (UnknownIdError names one not
        held)."""
        ids = as_id_array(ids).tolist()
        with self._lock.read():
            missing = [i for i in ids if i not in self._strings]
            if missing:
                raise UnknownIdError(
                    f"ids must be stored; {len(missing)} are not, e.g. id {missing[0]}")
            return [self._strings[i] for i in ids]

    # -- search -----------------------------------------------------------------------------

    def _search(self, q: np.ndarray, k: int, n_candidates: int | None = None,
                ef: int | None = None, n_threads: int = 1,
                filt: IdFilter | None = None) -> SearchResult:
        """Top-k by exact edit distance among the ``n_candidates`` embedding-nearest (found
        among the allowed items), ties by smaller id."""
        T = max(k, 1024) if n_candidates is None else check_int("n_candidates", n_candidates, 1)
        T = min(max(T, k), len(self))
        n_threads = check_threads(n_threads)
        queries = q.tolist()
        params: dict[str, Any] = {} if filt is None else filt.kwargs()
        if "ef" in self._vectors.capabilities.search_params:
            params["ef"] = max(T, 0 if ef is None else check_int("ef", ef, 1))
        if "n_threads" in self._vectors.capabilities.search_params:
            params["n_threads"] = n_threads
        cand = self._vectors.search(self.encoder.encode(queries), T, **params).ids
        nq = len(queries)
        ids = np.full((nq, k), -1, np.int64)
        dists = np.full((nq, k), np.inf, np.float32)
        strings = self._strings
        for r in range(nq):
            c = cand[r][cand[r] >= 0]
            # candidates come nearest first, so the running cutoff tightens early: measured
            # 3x faster than plain distances on proteins; the top k are exact
            d = distances_with_cutoff(queries[r], [strings[i] for i in c.tolist()], k,
                                      RERANK_BLOCK)
            order = np.lexsort((c, d))[:k]
            ids[r, : order.size] = c[order]
            dists[r, : order.size] = d[order]
        return SearchResult(ids, dists)

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        return self._search(q, k, filt=filt, **params)

    # -- persistence ------------------------------------------------------------------------

    def _get_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The encoder's weights, the strings (UTF-8 with offsets, in id order) and the vector
        index's own file as bytes."""
        if self.encoder is None:
            return {}, {}
        enc_header, enc_arrays = self.encoder._state()
        ids = self._idset.sorted
        blobs = [self._strings[i].encode("utf-8") for i in ids.tolist()]
        offsets = np.zeros(len(blobs) + 1, np.int64)
        np.cumsum([len(b) for b in blobs], out=offsets[1:])
        arrays = {f"encoder/{k}": v for k, v in enc_arrays.items()}
        arrays.update(offsets=offsets, text=np.frombuffer(b"".join(blobs), np.uint8),
                      vectors=np.frombuffer(self._vectors.to_bytes(), np.uint8))
        return {"encoder": enc_header}, arrays

    def _set_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        if "encoder" not in meta:
            return
        enc_arrays = {k.split("/", 1)[1]: v for k, v in arrays.items()
                      if k.startswith("encoder/")}
        encoder = CNNEDEncoder._from_state(meta["encoder"], enc_arrays, "the encoder")
        self._train(encoder)
        self._vectors = loads_vector_index(arrays["vectors"])
        if self._vectors.dim != encoder.embed_dim:
            raise ValueError(f"the embeddings' index has dim {self._vectors.dim}, the encoder "
                             f"embeds in {encoder.embed_dim}")
        text, off = arrays["text"].tobytes(), arrays["offsets"]
        ids = self._idset.sorted.tolist()
        # offsets start at 0, never go back and end at the text's end: otherwise strings
        # would be served cut or from another item's bytes
        if off.shape != (len(ids) + 1,) or off[0] != 0 or off[-1] != len(text) or \
                (np.diff(off) < 0).any():
            raise ValueError("the string offsets do not match the ids held and the text")
        self._strings = {i: text[off[j] : off[j + 1]].decode("utf-8") for j, i in enumerate(ids)}
        if not np.array_equal(self._vectors.ids(), self._idset.sorted):
            raise ValueError("the embeddings' ids do not match the strings' ids")


def restore_legacy(header: dict, arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """The (header, arrays) of a file written before StringIndex was an ordinary kind, in the
    form it has now (a node's string collections keep their snapshots across the change)."""
    if header.get("class") == "string-collection":  # an untrained collection's index
        return {"class": "strings", "dim": 0, "metric": "edit", "params": header["params"],
                "next_id": 0, "trained": False, "count": 0, "meta": {}}, \
            {"__ids__": np.empty(0, np.int64)}
    ids = np.asarray(arrays.pop("ids"), np.int64)
    order = np.argsort(ids, kind="stable")
    text, off = arrays.pop("text").tobytes(), arrays.pop("offsets")
    blobs = [text[off[j] : off[j + 1]] for j in order.tolist()]
    offsets = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    vectors = loads_vector_index(arrays["vectors"])
    arrays.update(__ids__=ids[order], offsets=offsets,
                  text=np.frombuffer(b"".join(blobs), np.uint8))
    params = dict(header["params"])
    params.setdefault("encoder", {})
    return {"class": "strings", "dim": 0, "metric": "edit", "params": params,
            "next_id": vectors.next_id, "trained": True, "count": header["count"],
            "meta": {"encoder": header["meta"]["encoder"]}}, arrays
