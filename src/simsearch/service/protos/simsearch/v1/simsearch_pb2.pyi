from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Matrix(_message.Message):
    __slots__ = ("data", "rows", "cols")
    DATA_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    rows: int
    cols: int
    def __init__(self, data: _Optional[bytes] = ..., rows: _Optional[int] = ..., cols: _Optional[int] = ...) -> None: ...

class CollectionInfo(_message.Message):
    __slots__ = ("name", "dim", "metric", "kind", "params_json", "count", "trained", "needs_training", "supports_remove", "search_params", "schema_json", "part_replica", "incarnation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    NEEDS_TRAINING_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_REMOVE_FIELD_NUMBER: _ClassVar[int]
    SEARCH_PARAMS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    PART_REPLICA_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    metric: str
    kind: str
    params_json: str
    count: int
    trained: bool
    needs_training: bool
    supports_remove: bool
    search_params: _containers.RepeatedScalarFieldContainer[str]
    schema_json: str
    part_replica: bool
    incarnation: str
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., metric: _Optional[str] = ..., kind: _Optional[str] = ..., params_json: _Optional[str] = ..., count: _Optional[int] = ..., trained: _Optional[bool] = ..., needs_training: _Optional[bool] = ..., supports_remove: _Optional[bool] = ..., search_params: _Optional[_Iterable[str]] = ..., schema_json: _Optional[str] = ..., part_replica: _Optional[bool] = ..., incarnation: _Optional[str] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("name", "dim", "metric", "kind", "params_json", "schema_json", "part_replica", "incarnation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    PART_REPLICA_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    metric: str
    kind: str
    params_json: str
    schema_json: str
    part_replica: bool
    incarnation: str
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ..., metric: _Optional[str] = ..., kind: _Optional[str] = ..., params_json: _Optional[str] = ..., schema_json: _Optional[str] = ..., part_replica: _Optional[bool] = ..., incarnation: _Optional[str] = ...) -> None: ...

class CollectionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropCollectionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCollectionsResponse(_message.Message):
    __slots__ = ("collections",)
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    collections: _containers.RepeatedCompositeFieldContainer[CollectionInfo]
    def __init__(self, collections: _Optional[_Iterable[_Union[CollectionInfo, _Mapping]]] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("collection", "vectors", "texts", "encoder", "params_json")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    collection: str
    vectors: Matrix
    texts: _containers.RepeatedScalarFieldContainer[str]
    encoder: bytes
    params_json: str
    def __init__(self, collection: _Optional[str] = ..., vectors: _Optional[_Union[Matrix, _Mapping]] = ..., texts: _Optional[_Iterable[str]] = ..., encoder: _Optional[bytes] = ..., params_json: _Optional[str] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("collection", "vectors", "ids", "auto_ids", "upsert", "texts", "attributes_json")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    AUTO_IDS_FIELD_NUMBER: _ClassVar[int]
    UPSERT_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_JSON_FIELD_NUMBER: _ClassVar[int]
    collection: str
    vectors: Matrix
    ids: _containers.RepeatedScalarFieldContainer[int]
    auto_ids: bool
    upsert: bool
    texts: _containers.RepeatedScalarFieldContainer[str]
    attributes_json: str
    def __init__(self, collection: _Optional[str] = ..., vectors: _Optional[_Union[Matrix, _Mapping]] = ..., ids: _Optional[_Iterable[int]] = ..., auto_ids: _Optional[bool] = ..., upsert: _Optional[bool] = ..., texts: _Optional[_Iterable[str]] = ..., attributes_json: _Optional[str] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("collection", "ids", "missing_ok")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    MISSING_OK_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    missing_ok: bool
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., missing_ok: _Optional[bool] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("collection", "queries", "k", "params_json", "query_texts", "allow", "deny", "where_json")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    QUERY_TEXTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    WHERE_JSON_FIELD_NUMBER: _ClassVar[int]
    collection: str
    queries: Matrix
    k: int
    params_json: str
    query_texts: _containers.RepeatedScalarFieldContainer[str]
    allow: IdList
    deny: IdList
    where_json: str
    def __init__(self, collection: _Optional[str] = ..., queries: _Optional[_Union[Matrix, _Mapping]] = ..., k: _Optional[int] = ..., params_json: _Optional[str] = ..., query_texts: _Optional[_Iterable[str]] = ..., allow: _Optional[_Union[IdList, _Mapping]] = ..., deny: _Optional[_Union[IdList, _Mapping]] = ..., where_json: _Optional[str] = ...) -> None: ...

class IdList(_message.Message):
    __slots__ = ("ids", "lengths")
    IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    lengths: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[bytes] = ..., lengths: _Optional[_Iterable[int]] = ...) -> None: ...

class SearchResponse(_message.Message):
    __slots__ = ("rows", "k", "ids", "scores", "coverage")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    rows: int
    k: int
    ids: bytes
    scores: bytes
    coverage: float
    def __init__(self, rows: _Optional[int] = ..., k: _Optional[int] = ..., ids: _Optional[bytes] = ..., scores: _Optional[bytes] = ..., coverage: _Optional[float] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("collection", "ids", "vectors", "where_json", "all", "pages", "offset")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    WHERE_JSON_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    collection: str
    ids: bytes
    vectors: bool
    where_json: str
    all: bool
    pages: bool
    offset: int
    def __init__(self, collection: _Optional[str] = ..., ids: _Optional[bytes] = ..., vectors: _Optional[bool] = ..., where_json: _Optional[str] = ..., all: _Optional[bool] = ..., pages: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("ids", "vectors", "attributes_json", "next_offset")
    IDS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ids: bytes
    vectors: Matrix
    attributes_json: str
    next_offset: int
    def __init__(self, ids: _Optional[bytes] = ..., vectors: _Optional[_Union[Matrix, _Mapping]] = ..., attributes_json: _Optional[str] = ..., next_offset: _Optional[int] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("collection", "config_json", "data")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    collection: str
    config_json: str
    data: bytes
    def __init__(self, collection: _Optional[str] = ..., config_json: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class BlobInfo(_message.Message):
    __slots__ = ("name", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class ListBlobsResponse(_message.Message):
    __slots__ = ("blobs",)
    BLOBS_FIELD_NUMBER: _ClassVar[int]
    blobs: _containers.RepeatedCompositeFieldContainer[BlobInfo]
    def __init__(self, blobs: _Optional[_Iterable[_Union[BlobInfo, _Mapping]]] = ...) -> None: ...

class PartOp(_message.Message):
    __slots__ = ("pseq", "remove", "vectors", "ids", "attributes_json")
    PSEQ_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_JSON_FIELD_NUMBER: _ClassVar[int]
    pseq: int
    remove: bool
    vectors: Matrix
    ids: bytes
    attributes_json: str
    def __init__(self, pseq: _Optional[int] = ..., remove: _Optional[bool] = ..., vectors: _Optional[_Union[Matrix, _Mapping]] = ..., ids: _Optional[bytes] = ..., attributes_json: _Optional[str] = ...) -> None: ...

class PartPrepareRequest(_message.Message):
    __slots__ = ("collection", "term", "attempt", "ops")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    collection: str
    term: int
    attempt: int
    ops: _containers.RepeatedCompositeFieldContainer[PartOp]
    def __init__(self, collection: _Optional[str] = ..., term: _Optional[int] = ..., attempt: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[PartOp, _Mapping]]] = ...) -> None: ...

class PartSyncRequest(_message.Message):
    __slots__ = ("collection", "term", "ballot_term", "ballot_attempt", "first", "through")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_TERM_FIELD_NUMBER: _ClassVar[int]
    BALLOT_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    collection: str
    term: int
    ballot_term: int
    ballot_attempt: int
    first: int
    through: int
    def __init__(self, collection: _Optional[str] = ..., term: _Optional[int] = ..., ballot_term: _Optional[int] = ..., ballot_attempt: _Optional[int] = ..., first: _Optional[int] = ..., through: _Optional[int] = ...) -> None: ...

class PartOpsRequest(_message.Message):
    __slots__ = ("collection", "after")
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    collection: str
    after: int
    def __init__(self, collection: _Optional[str] = ..., after: _Optional[int] = ...) -> None: ...

class PartOpsResponse(_message.Message):
    __slots__ = ("ops", "applied")
    OPS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[PartOp]
    applied: int
    def __init__(self, ops: _Optional[_Iterable[_Union[PartOp, _Mapping]]] = ..., applied: _Optional[int] = ...) -> None: ...

class PartState(_message.Message):
    __slots__ = ("term", "applied", "count")
    TERM_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    term: int
    applied: int
    count: int
    def __init__(self, term: _Optional[int] = ..., applied: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "max_message_bytes", "index_kinds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_KINDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    max_message_bytes: int
    index_kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., index_kinds: _Optional[_Iterable[str]] = ...) -> None: ...
