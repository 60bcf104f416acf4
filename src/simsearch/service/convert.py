"""The one place that converts between numpy arrays and the protocol's messages."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import (
    DimensionMismatchError,
    InvalidFilterError,
    InvalidParameterError,
    InvalidVectorError,
)
from ..index import SearchResult
from .errors import ServiceError
from .protos.simsearch.v1 import simsearch_pb2 as pb

_F32 = np.dtype("<f4")
_I64 = np.dtype("<i8")
#: bytes a search response needs per result besides its fixed overhead (id + score)
RESULT_BYTES = _I64.itemsize + _F32.itemsize


def put_matrix(m: pb.Matrix, x: np.ndarray) -> None:
    """Fill a message's Matrix field with a float32 (n, d) array, in place: building a Matrix
    and copying it into the message costs twice as much (a client's every search)."""
    x = np.ascontiguousarray(x, dtype=_F32)
    m.data = x.tobytes()
    m.rows, m.cols = x.shape


def to_matrix(x: np.ndarray) -> pb.Matrix:
    """A float32 (n, d) array as a Matrix message of its own."""
    m = pb.Matrix()
    put_matrix(m, x)
    return m


def from_matrix(m: pb.Matrix, dim: int, what: str = "vectors") -> np.ndarray:
    """A Matrix message as a read-only float32 (rows, cols) view, checked against ``dim``."""
    if m.cols != dim:
        raise DimensionMismatchError(
            f"{what} must have shape (n, {dim}); got a matrix with {m.cols} columns"
        )
    data = m.data  # each read of a bytes field copies it
    expected = m.rows * m.cols * _F32.itemsize
    if len(data) != expected:
        raise InvalidVectorError(
            f"{what}: a ({m.rows}, {m.cols}) float32 matrix needs {expected} bytes of packed "
            f"little-endian data; got {len(data)}"
        )
    return np.ndarray((m.rows, m.cols), _F32, data)  # read-only, like the bytes


def items_from(texts, m: pb.Matrix, dim: int, what: str = "vectors") -> Any:
    """A message's items: its texts when it carries some (a string collection's), else its
    matrix; the collection's index says whether they are of its kind."""
    if len(texts):
        if m.rows or m.data:
            raise InvalidParameterError(f"{what}: a message carries texts or vectors, not both")
        return list(texts)
    return from_matrix(m, dim, what)


def ids_from_bytes(data: bytes, what: str = "ids") -> np.ndarray:
    """Packed little-endian int64 ids (a part op's) as an int64 array."""
    if len(data) % _I64.itemsize:
        raise InvalidParameterError(
            f"{what} must be packed int64 (a multiple of 8 bytes); got {len(data)} bytes")
    return np.frombuffer(data, dtype=_I64).astype(np.int64)


def to_part_op(op) -> pb.PartOp:
    """A fenced.PartOp as its message."""
    m = pb.PartOp(pseq=op.pseq, remove=op.remove,
                  ids=np.ascontiguousarray(op.ids, dtype=_I64).tobytes())
    if not op.remove:
        put_matrix(m.vectors, op.x)
    if op.attributes:
        m.attributes_json = dump_params(op.attributes)
    return m


def to_search_response(r: SearchResult) -> pb.SearchResponse:
    # fields set one by one: the keyword constructor costs a node's every search 1.5x as much
    out = pb.SearchResponse()
    out.rows, out.k = r.ids.shape
    out.ids = r.ids.astype(_I64, copy=False).tobytes()  # tobytes writes C order whatever the layout
    out.scores = r.scores.astype(_F32, copy=False).tobytes()
    if r.coverage < 1.0:  # partial results (a cluster)
        out.coverage = r.coverage
    return out


def from_search_response(resp: pb.SearchResponse) -> SearchResult:
    rows, k = resp.rows, resp.k
    ids, scores = resp.ids, resp.scores
    if len(ids) != rows * k * _I64.itemsize or len(scores) != rows * k * _F32.itemsize:
        raise ServiceError(  # the server broke the protocol: nothing the caller can fix
            f"a search response of {rows} x {k} results needs {rows * k * _I64.itemsize} bytes "
            f"of ids and {rows * k * _F32.itemsize} of scores; got {len(ids)} and {len(scores)}",
            code="INTERNAL")
    # one call per array (writable copies): this runs on every search, cold between calls
    return SearchResult(np.ndarray((rows, k), _I64, bytearray(ids)),
                        np.ndarray((rows, k), _F32, bytearray(scores)),
                        coverage=float(resp.coverage) if resp.HasField("coverage") else 1.0)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"cannot send a parameter of type {type(o).__name__}")


def dump_params(params: dict[str, Any]) -> str:
    if not params:
        return ""
    try:
        return json.dumps(params, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"parameters must be JSON values; {exc}") from None


def load_params(text: str, what: str = "params_json") -> dict[str, Any]:
    if not text:
        return {}
    try:
        out = json.loads(text)
    except RecursionError:
        raise InvalidParameterError(f"{what} is nested too deeply") from None
    except ValueError:
        raise InvalidParameterError(f"{what} must be a JSON object; got invalid JSON") from None
    if not isinstance(out, dict):
        raise InvalidParameterError(f"{what} must be a JSON object; got {type(out).__name__}")
    return out


def to_id_list(v: np.ndarray | list[np.ndarray]) -> pb.IdList:
    """A filter's id list (simsearch.filters: one array, or one per query) as its message."""
    if isinstance(v, list):
        return pb.IdList(ids=np.concatenate([np.asarray(a, _I64) for a in v] or
                                            [np.empty(0, _I64)]).tobytes(),
                         lengths=[len(a) for a in v])
    return pb.IdList(ids=np.ascontiguousarray(v, dtype=_I64).tobytes())


def from_id_list(m: pb.IdList, nq: int, what: str) -> np.ndarray | list[np.ndarray]:
    ids = ids_from_bytes(m.ids, what)
    if not m.lengths:
        return ids
    lengths = np.asarray(m.lengths, np.int64)
    if lengths.size != nq or int(lengths.sum()) != ids.size:
        raise InvalidFilterError(
            f"{what}: per-query lengths must give one count per query ({nq}) summing to the "
            f"{ids.size} ids; got {lengths.size} counts summing to {int(lengths.sum())}")
    return np.split(ids, np.cumsum(lengths)[:-1])


def load_json(text: str, what: str) -> Any:
    """A JSON field (attributes, a where filter, a schema); None when empty."""
    if not text:
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidFilterError(f"{what} is nested too deeply") from None
    except ValueError:
        raise InvalidFilterError(f"{what} must be valid JSON") from None
