"""StringIndex: edit-distance search over strings. Embed with an encoder, take the T nearest
embeddings from a vector index (metric "l2"), re-rank them by exact edit distance."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._rwlock import RWLock
from ..errors import CorruptIndexError, InvalidParameterError, NotTrainedError, UnknownIdError
from ..fileformat import read_index_file, write_index_file
from ..index import (
    as_id_array,
    check_int,
    check_k,
    check_threads,
    create_index,
)
from ..index import loads as loads_vector_index
from ._alphabet import check_strings
from .brute import distances_with_cutoff
from .encoder import CNNEDEncoder

FILE_CLASS = "string-index"
PAD_DISTANCE = np.iinfo(np.int32).max
RERANK_BLOCK = 128  # candidates scored per cdist call; the cutoff tightens in between


@dataclass(frozen=True)
class StringSearchResult:
    """``ids`` int64 (nq, k), best first, -1 where fewer than k results exist; ``distances``
    int32 (nq, k): the exact edit (Levenshtein) distance, int32 max as padding."""

    ids: np.ndarray
    distances: np.ndarray

    def __iter__(self) -> Iterator[np.ndarray]:
        yield self.ids
        yield self.distances


class StringIndex:
    """Nearest strings by edit distance, through CNN-ED embeddings and exact re-ranking.

    Parameters
    ----------
    encoder : a trained :class:`CNNEDEncoder` (its alphabet is the index's fixed alphabet).
    index : vector index kind holding the embeddings under metric "l2" ("hnsw", "flat", ...).
    **index_params : build parameters of that index (e.g. ``M``, ``ef_construction``).

    Search parameters, per call: ``n_candidates`` (the paper's T: embedding-nearest candidates
    re-ranked by exact edit distance, default max(k, 1024)), ``ef`` (HNSW beam, raised to T),
    ``n_threads``. Searches may run concurrently; writes (add, remove, save) are serialized.
    """

    def __init__(self, encoder: CNNEDEncoder, index: str = "hnsw", **index_params: Any):
        if not isinstance(encoder, CNNEDEncoder):
            raise InvalidParameterError(
                f"encoder must be a CNNEDEncoder; got {type(encoder).__name__}")
        if not encoder.is_trained:
            raise NotTrainedError("the encoder must be fit() (or loaded) before a StringIndex")
        self.encoder = encoder
        self.index_kind = index
        self.index_params = dict(index_params)
        self._vectors = create_index(index, encoder.dim, "l2", **index_params)
        self._strings: dict[int, str] = {}
        self._lock = RWLock()  # the Index concurrency rule (docs/architecture.md)

    def __len__(self) -> int:
        return len(self._strings)

    @property
    def next_id(self) -> int:
        """The first id an ``add`` without ids gives."""
        return self._vectors.next_id

    def __repr__(self) -> str:
        return f"StringIndex({self.encoder!r}, index={self.index_kind!r}) n={len(self)}"

    def add(self, strings: list[str], ids: Any = None, batch_size: int = 2048,
            embeddings: np.ndarray | None = None) -> np.ndarray:
        """Embed and add strings; ids default to consecutive integers. Returns int64 ids. The
        whole batch is checked (types, alphabet, ids) before anything changes.
        ``embeddings``: ``encoder.encode(strings)`` when the caller already has it."""
        strings = check_strings(strings)
        if embeddings is None:
            x = self.encoder.encode(strings, batch_size=batch_size)
        else:
            self.encoder.alphabet.encode(strings, 1)  # the alphabet check encode() would make
            x = np.asarray(embeddings, np.float32)
            if x.shape != (len(strings), self.encoder.dim):
                raise InvalidParameterError(
                    f"embeddings must have shape ({len(strings)}, {self.encoder.dim}); "
                    f"got {x.shape}")
        with self._lock.write():
            ids = self._vectors.add(x, ids if ids is None else as_id_array(ids))
            self._strings.update(zip(ids.tolist(), strings, strict=True))
        return ids

    def remove(self, ids: Any) -> int:
        with self._lock.write():
            ids = as_id_array(ids)
            n = self._vectors.remove(ids)
            for i in ids.tolist():
                del self._strings[i]
            return n

    def contains(self, ids: Any) -> np.ndarray:
        """A boolean per id: is it stored?"""
        ids = as_id_array(ids).tolist()
        with self._lock.read():
            return np.fromiter((i in self._strings for i in ids), bool, len(ids))

    def get(self, ids: Any) -> list[str]:
        """The stored strings of ``ids`` (UnknownIdError for an id not stored)."""
        ids = as_id_array(ids).tolist()
        with self._lock.read():
            missing = [i for i in ids if i not in self._strings]
            if missing:
                raise UnknownIdError(
                    f"ids must be stored; {len(missing)} are not, e.g. id {missing[0]}")
            return [self._strings[i] for i in ids]

    def ids(self) -> np.ndarray:
        """The ids stored, sorted."""
        return self._vectors.ids()

    def search(self, queries: list[str], k: int, n_candidates: int | None = None,
               ef: int | None = None, n_threads: int = 1, allow: Any = None,
               deny: Any = None) -> StringSearchResult:
        """Top-k strings by exact edit distance among the ``n_candidates`` embedding-nearest
        (the paper's T), ties by smaller id; ``allow`` / ``deny`` as for vector indexes
        (the candidates are found among the allowed items)."""
        queries = check_strings(queries, "queries")
        k = check_k(k)
        T = max(k, 1024) if n_candidates is None else check_int("n_candidates", n_candidates, 1)
        T = max(T, k)
        n_threads = check_threads(n_threads)
        xq = self.encoder.encode(queries)
        with self._lock.read():  # candidates and their strings from one state of the index
            return self._search(queries, xq, k, T, ef, n_threads, allow, deny)

    def _search(self, queries, xq, k, T, ef, n_threads, allow=None,
                deny=None) -> StringSearchResult:
        nq = len(queries)
        ids = np.full((nq, k), -1, np.int64)
        dists = np.full((nq, k), PAD_DISTANCE, np.int32)
        if len(self) == 0:
            return StringSearchResult(ids, dists)
        params: dict[str, Any] = {}
        if "ef" in self._vectors.search_params:
            params["ef"] = max(T, ef or 0)
        if "n_threads" in self._vectors.search_params:
            params["n_threads"] = n_threads
        cand = self._vectors.search(xq, min(T, len(self)), allow=allow, deny=deny,
                                    **params).ids
        strings = self._strings
        for r in range(nq):
            c = cand[r][cand[r] >= 0]
            texts = [strings[i] for i in c.tolist()]
            # candidates come nearest first, so the running cutoff tightens early: measured
            # 3x faster than plain distances on proteins; the top k are exact
            d = distances_with_cutoff(queries[r], texts, k, RERANK_BLOCK)
            order = np.lexsort((c, d))[:k]
            ids[r, : order.size] = c[order]
            dists[r, : order.size] = d[order]
        return StringSearchResult(ids, dists)

    # -- persistence --------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """One checksummed file written atomically: the encoder's weights, the strings (UTF-8
        with offsets), their ids, and the vector index's own file as bytes."""
        with self._lock.read():
            enc_header, enc_arrays = self.encoder._state()
            ids = np.fromiter(self._strings.keys(), np.int64, count=len(self))
            blobs = [s.encode("utf-8") for s in self._strings.values()]
            offsets = np.zeros(len(blobs) + 1, np.int64)
            np.cumsum([len(b) for b in blobs], out=offsets[1:])
            vbytes = np.frombuffer(self._vectors.to_bytes(), np.uint8)
            header = {
                "class": FILE_CLASS, "metric": "edit", "dim": self.encoder.dim,
                "count": len(self), "params": {"index": self.index_kind, **self.index_params},
                "meta": {"encoder": enc_header},
            }
            arrays = {f"encoder/{k}": v for k, v in enc_arrays.items()}
            arrays.update(ids=ids, offsets=offsets,
                          text=np.frombuffer(b"".join(blobs), np.uint8), vectors=vbytes)
            write_index_file(path, header, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> StringIndex:
        header, arrays = read_index_file(path)
        if header.get("class") != FILE_CLASS:
            raise CorruptIndexError(f"{path} holds a {header.get('class')!r}, not a StringIndex")
        try:
            enc_arrays = {k.split("/", 1)[1]: v for k, v in arrays.items()
                          if k.startswith("encoder/")}
            encoder = CNNEDEncoder._from_state(header["meta"]["encoder"], enc_arrays, str(path))
            params = dict(header["params"])
            obj = cls.__new__(cls)
            obj.encoder = encoder
            obj.index_kind = params.pop("index")
            obj.index_params = params
            obj._lock = RWLock()
            obj._vectors = loads_vector_index(arrays["vectors"])
            text = arrays["text"].tobytes()
            off = arrays["offsets"]
            ids = arrays["ids"]
            obj._strings = {int(i): text[off[j] : off[j + 1]].decode("utf-8")
                            for j, i in enumerate(ids.tolist())}
        except CorruptIndexError:
            raise
        except Exception as exc:
            raise CorruptIndexError(f"{path} could not be restored as a StringIndex: {exc}") \
                from None
        if len(obj._strings) != header["count"] or len(obj._vectors) != header["count"]:
            raise CorruptIndexError(f"{path}: header says {header['count']} strings, found "
                                    f"{len(obj._strings)} strings and {len(obj._vectors)} vectors")
        return obj
