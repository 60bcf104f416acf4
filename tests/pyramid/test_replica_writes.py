"""A part's replicas catching up (RemotePart.catch_up) over real shard stores, in process: a part
whose every replica missed a commit is not lost; a replica that missed a prepare is re-copied
from a current one; nothing is marked in sync that is not current (docs/cluster.md, "Writes")."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("grpc")

from simsearch.pyramid.parts import RemotePart  # noqa: E402
from simsearch.pyramid.replication import PartSequences  # noqa: E402
from simsearch.service.fenced import PartOp  # noqa: E402
from simsearch.service.store import Store  # noqa: E402

DIM, NAME, TERM = 4, "docs.p0", 7


class StoreClient:
    """The part calls of a shard's client, straight on its Store."""

    def __init__(self, store: Store):
        self.store = store

    def part_prepare(self, name, term, attempt, ops, timeout=None):
        return self.store.get(name).part_prepare(term, attempt, ops)

    def part_sync(self, name, term, ballot=(0, 0), first=0, through=0, timeout=None):
        return self.store.get(name).part_sync(term, ballot, first, through)

    def part_ops(self, name, after, timeout=None):
        return self.store.get(name).part_ops(after, 1 << 20)

    def export_collection(self, name):
        self.exports = getattr(self, "exports", 0) + 1
        return self.store.get(name).export()

    def import_collection(self, name, config, data):
        return self.store.import_collection(name, config, data)

    def collection(self, name):
        col = self.store.get(name)  # CollectionNotFoundError as a node's client raises it

        class Handle:
            def describe(self):
                return col.describe()

        return Handle()

    def create_collection(self, name, dim, metric, kind, schema=None, *, part_replica=False,
                          incarnation="", **params):
        return self.store.create(name, dim, metric, kind, params, schema=schema,
                                 part_replica=part_replica, incarnation=incarnation)

    def drop_collection(self, name):
        self.store.drop(name)


class Owner:
    """What catch_up reads of a router copy: its parts' committed sequences."""

    def __init__(self):
        self.seqs = PartSequences.empty(1)

    def commit(self, first: int, through: int, attempt: int) -> None:
        self.seqs = self.seqs.committed({"parts": [0], "first": [first], "through": [through],
                                         "ballot": [TERM, attempt]})


class Pool:
    def __init__(self, stores):
        self.clients = {s: StoreClient(st) for s, st in stores.items()}
        self.in_sync_set = set(stores)
        self.up = dict.fromkeys(stores, True)
        self.parts: dict = {}
        self.part_locks = {NAME: __import__("threading").Lock()}
        self.timeout = 5.0
        self.attempts = iter(range(100, 10**6))

    def next_attempt(self):
        return next(self.attempts)

    def client(self, sid):
        return self.clients[sid]

    def replicas_of(self, name):
        return sorted(self.clients)

    def term(self):
        return TERM

    def mark_in_sync(self, name, sid):
        self.in_sync_set.add(sid)

    def mark_out_of_sync(self, name, sid, strict=False):
        self.in_sync_set.discard(sid)


def vec(ids):
    x = np.zeros((len(ids), DIM), np.float32)
    x[:, 0] = ids
    return x


def write(part, owner, sids_prepare, sids_sync, ids, attempt):
    """One committed write of an upsert to the part: prepared on ``sids_prepare``, synced on
    ``sids_sync``, committed in the router."""
    seq = int(owner.seqs.seq[0]) + 1
    op = PartOp(seq, False, np.asarray(ids, np.int64), vec(ids))
    for s in sids_prepare:
        part.prepare(s, TERM, attempt, [op], 5.0)
    owner.commit(seq, seq, attempt)
    for s in sids_sync:
        part.sync(s, TERM, (TERM, attempt), seq, seq)


@pytest.fixture
def setup(tmp_path):
    stores = {s: Store(tmp_path / f"shard{s}") for s in (0, 1)}
    for st in stores.values():
        st.create(NAME, DIM, "l2", "flat", {}, part_replica=True)
    pool, router = Pool(stores), Owner()
    part = RemotePart(pool, NAME, {}, 0)
    part.owner = router
    pool.parts[NAME] = part
    yield stores, pool, router, part
    for st in stores.values():
        st.close()


def test_every_replica_missed_the_commit_and_both_catch_up(setup):
    stores, pool, router, part = setup
    write(part, router, [0, 1], [0, 1], [1, 2], attempt=1)
    write(part, router, [0, 1], [], [3], attempt=2)  # both replicas crashed before the sync
    write(part, router, [0, 1], [], [4], attempt=3)  # (recovery replays the prepared ops)
    pool.in_sync_set.clear()
    for sid in (0, 1):
        part.catch_up(sid)
    assert pool.in_sync_set == {0, 1}
    for st in stores.values():
        assert st.get(NAME).fenced.applied == 3 and len(st.get(NAME).index) == 4


@pytest.mark.parametrize("peer_snapshotted", [False, True])
def test_a_replica_that_missed_prepares_gets_the_ops_or_a_copy(setup, peer_snapshotted):
    """The ops it lacks come from a current peer's log; only when that log was compacted by a
    snapshot is the whole replica copied."""
    stores, pool, router, part = setup
    write(part, router, [0, 1], [0, 1], [1, 2], attempt=1)
    for a, i in enumerate(range(3, 40), start=2):  # shard 1 was down for 37 writes
        write(part, router, [0], [0], [i], attempt=a)
    if peer_snapshotted:
        stores[0].get(NAME).snapshot()
    pool.in_sync_set.discard(1)
    part.catch_up(1)
    assert pool.in_sync_set == {0, 1}
    col = stores[1].get(NAME)
    assert col.fenced.applied == 38 and len(col.index) == 39 and col.fenced.term == TERM
    assert getattr(pool.client(0), "exports", 0) == int(peer_snapshotted)
    np.testing.assert_array_equal(col.search(vec(range(1, 40)), 1).ids[:, 0],
                                  np.arange(1, 40))


def test_no_current_replica_raises_and_marks_nothing(setup):
    stores, pool, router, part = setup
    write(part, router, [0, 1], [0, 1], [1], attempt=1)
    # committed in the log, but no replica holds the op (a router ahead of every replica)
    router.commit(2, 2, 9)
    pool.in_sync_set.clear()
    with pytest.raises(Exception, match="no replica has applied"):
        part.catch_up(0)
    assert pool.in_sync_set == set()


def test_a_copy_of_a_dropped_incarnation_is_replaced_never_adopted(tmp_path):
    """The defect: a shard paused across the drop of a collection kept its part
    copies; when the name was re-created, ``ensure`` took CollectionExistsError as success and
    adopted them, so searches returned the dropped collection's ids (7,274 of them in 90
    searches) and the part ran one replica short for good. Seen failing on the code before: the
    stale copy stayed in sync with its 50 old items. Parts now carry the collection's
    incarnation; a foreign copy is marked out of sync, and catch-up replaces it."""
    stores = {s: Store(tmp_path / f"shard{s}") for s in (0, 1)}
    stale = stores[1].create(NAME, DIM, "l2", "flat", {}, part_replica=True, incarnation="01d")
    stale.part_prepare(TERM, 1, [PartOp(1, False, np.arange(1000, 1050), vec(range(1000, 1050)))])
    stale.part_sync(TERM, (TERM, 1), 1, 1)  # the dropped collection's items
    pool, router = Pool(stores), Owner()
    config = {"dim": DIM, "metric": "l2", "kind": "flat", "params": {}, "incarnation": "2e3"}
    part = RemotePart(pool, NAME, config, 0)
    part.owner = router
    pool.parts[NAME] = part
    part.ensure()  # shard 0 gets a new copy; shard 1's is another incarnation's
    assert pool.in_sync_set == {0}
    assert stores[0].get(NAME).describe()["incarnation"] == "2e3"
    write(part, router, [0], [0], [1, 2], attempt=2)
    part.catch_up(1)
    assert pool.in_sync_set == {0, 1}
    for st in stores.values():
        col = st.get(NAME)
        assert col.describe()["incarnation"] == "2e3"
        assert sorted(col.index.ids().tolist()) == [1, 2]  # nothing of the dropped one
    for st in stores.values():
        st.close()


def test_a_replica_holding_another_write_at_a_committed_sequence_is_recopied(setup):
    """Replicas are compared by ballot, not only by sequence: shard 1 applied sequence 2 from a
    write the log never committed (another ballot, other content), so it reports the same
    sequence as shard 0. On the code before, catch_up took that as current and marked it in
    sync: the replicas differed silently. Now the replica refuses the committed ballot's sync
    and is re-copied from shard 0."""
    stores, pool, router, part = setup
    write(part, router, [0, 1], [0, 1], [1], attempt=1)
    stray = PartOp(2, False, np.asarray([99], np.int64), vec([99]))
    part.prepare(1, TERM, 50, [stray], 5.0)  # never committed, applied on shard 1 only
    part.sync(1, TERM, (TERM, 50), 2, 2)
    write(part, router, [0], [0], [2], attempt=3)  # the committed sequence 2
    pool.in_sync_set.discard(1)
    part.catch_up(1)
    assert pool.in_sync_set == {0, 1}
    assert getattr(pool.client(0), "exports", 0) == 1  # re-copied whole
    for st in stores.values():
        assert sorted(st.get(NAME).index.ids().tolist()) == [1, 2]
