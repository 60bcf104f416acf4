"""Static checks that the classes the service is handed provide its protocols
(simsearch.service.protocols and simsearch.index.Searchable). mypy checks this file in
``make lint`` (so in CI); nothing here runs."""

from __future__ import annotations

from simsearch.index import Index, Searchable
from simsearch.pyramid.collection import ClusterCollection
from simsearch.pyramid.collection import ClusterCollection as _Cluster
from simsearch.pyramid.control.etcd import Etcd
from simsearch.pyramid.control.kv import KeyValue
from simsearch.pyramid.coordinator import Coordinator
from simsearch.pyramid.parts import RemotePart
from simsearch.service.aio import AsyncClient, AsyncCollection
from simsearch.service.api import AsyncClientAPI, AsyncCollectionAPI, ClientAPI, CollectionAPI
from simsearch.service.client import Client, RemoteCollection, connect
from simsearch.service.collection import Collection
from simsearch.service.embedded import EmbeddedClient, EmbeddedCollection
from simsearch.service.partreplica import PartReplica
from simsearch.service.protocols import BlobStore, CollectionStore, ServedCollection
from simsearch.service.protocols import PartReplica as PartReplicaProtocol
from simsearch.service.store import Store


def node(store: Store, collection: Collection, replica: PartReplica) -> None:
    s: CollectionStore = store
    b: BlobStore = store
    c: ServedCollection = collection
    r: PartReplicaProtocol = replica
    del s, b, c, r


def coordinator(coord: Coordinator, collection: ClusterCollection) -> None:
    s: CollectionStore = coord
    c: ServedCollection = collection
    del s, c


def searchables(index: Index, remote: RemoteCollection, part: RemotePart,
                node: Collection, cluster: _Cluster, embedded: EmbeddedCollection) -> None:
    found: list[Searchable] = [index, remote, part, embedded]
    served: list[ServedCollection] = [node, cluster]
    del found, served


def one_client_interface(remote: Client, embedded: EmbeddedClient, rc: RemoteCollection,
                         ec: EmbeddedCollection) -> None:
    """Every client and collection ``connect`` can give implements the one declared API."""
    clients: list[ClientAPI] = [remote, embedded, connect(":memory:"), connect("h:1")]
    collections: list[CollectionAPI] = [rc, ec, remote.collection("c"),
                                        embedded.collection("c")]
    del clients, collections


def one_async_interface(client: AsyncClient, col: AsyncCollection) -> None:
    """The asyncio client and its collections implement the awaitable twin."""
    c: AsyncClientAPI = client
    k: AsyncCollectionAPI = col
    del c, k


def key_value(etcd: Etcd) -> None:
    """The etcd client provides what leases and watches act through."""
    kv: KeyValue = etcd
    del kv
