"""Mutated index files, loaded and used in a child process: a crafted or damaged file must give
CorruptIndexError on load, or load into an index that searches, adds and removes without
crashing the process (docs/architecture.md, "Persistence").

Most mutations re-seal the file's checksum, so they reach the validators behind it (a file
restored from an untrusted backup carries a valid checksum); the rest test the checksum itself.

    python tests/support/filefuzz.py --n 5000          # prints a summary line per kind

The child reports each case before it runs it, so a case that kills the process (a segfault in
native code) is named, counted, and the run goes on in a new child from the next case.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import zlib
from collections import Counter

import numpy as np

DIM, N = 8, 300
#: kind name -> (index kind, metric, build params, needs training)
KINDS = {
    "flat": ("flat", "l2", {}),
    "hnsw": ("hnsw", "ip", {"M": 8, "ef_construction": 40}),
    "norm-scan": ("norm-scan", "ip", {}),
    "norm-ivf": ("norm-ivf", "ip", {"n_lists": 8}),
    "simple-lsh": ("simple-lsh", "ip", {}),
    "nr-lsh": ("nr-lsh", "ip", {"n_ranges": 4}),
    "neq": ("neq", "ip", {"n_codebooks": 2, "nbits": 4, "fast_scan": True}),
    "ipnsw-plus": ("ipnsw-plus", "ip", {"M": 8}),
    "ipnsw-plus-float": ("ipnsw-plus", "ip", {"M": 8, "sq8": False}),
    "ipnsw-plus-quantized": ("ipnsw-plus", "ip", {"M": 8, "fast_scan": True}),
    "pyramid": ("pyramid", "ip", {"n_centers": 8, "n_partitions": 2, "mips_replicas": 4,
                                  "sub_index": "flat"}),
    # an encoder's weights, offsets into the strings' text, and the embeddings' own index
    "strings": ("strings", "edit", {"index": "flat"}),
    # rows by position (removed ones too), ids, the lists' end
    "sparse-flat": ("sparse-flat", "ip", {}),
    "bm25": ("bm25", "ip", {}),
    "sparse-seismic": ("sparse-seismic", "ip", {"n_postings": 50, "rebuild_after": 16}),
}
SPARSE = {"sparse-flat", "bm25", "sparse-seismic"}
_PREFIX = struct.Struct("<8sIIQ")
_TRAILER = struct.Struct("<I8s")


def items(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(N items, 3 queries) of the kind: long-tailed vectors, or DNA-like strings."""
    if KINDS[kind][0] == "strings":
        from string_fixture import strings

        base, queries = strings(N, 3)
        return base, queries
    if KINDS[kind][0] in SPARSE:
        import scipy.sparse as sp

        def rows(n, seed):
            m = sp.random(n, 64, density=0.1, format="csr", random_state=seed)
            m.sum_duplicates()
            m.data = np.ceil(m.data * 4).astype(np.float32)  # counts, for bm25 too
            return m

        return rows(N, 0), rows(3, 1)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((N, DIM)) * rng.lognormal(0, 0.5, (N, 1))).astype(np.float32)
    return x, np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)


def build(kind: str) -> bytes:
    import simsearch as ss

    name, metric, params = KINDS[kind]
    x, _ = items(kind)
    if name == "strings":
        from simsearch.strings import CNNEDEncoder

        enc = CNNEDEncoder(alphabet="acgt", max_len=16, embed_dim=8, seed=0).fit(
            x[:200].tolist(), epochs=1, n_train=200, n_neighbors=10, progress=False)
        params = {**params, "encoder": enc}
    dim = 0 if name == "strings" else 64 if name in SPARSE else DIM
    idx = ss.create_index(name, dim, metric, **params)
    if idx.capabilities.needs_training:
        idx.train(x)
    idx.add(x, ids=np.arange(N) * 3)
    idx.remove(np.arange(0, 30, 3))
    return idx.to_bytes()


def _seal(body: bytearray, hlen: int) -> bytes:
    """A file of ``body`` (header JSON + payload) with a valid prefix and checksum."""
    plen = len(body) - hlen
    return (_PREFIX.pack(b"SIMSRCH\x00", 1, hlen, plen) + bytes(body)
            + _TRAILER.pack(zlib.crc32(body), b"SIMSEND\x00"))


def _bump_number(text: str, rng: np.random.Generator) -> str:
    """One number in a JSON text changed a little (shapes, offsets, params, meta)."""
    import re

    nums = list(re.finditer(r"-?\d+", text))
    if not nums:
        return text
    m = nums[int(rng.integers(len(nums)))]
    v = int(m.group())
    new = int(rng.choice([v + 1, v - 1, 0, -1, v * 2, v // 2, v + 8, 1]))
    return text[: m.start()] + str(new) + text[m.end():]


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """One mutated copy of an index file."""
    magic, version, hlen, plen = _PREFIX.unpack_from(data, 0)
    body = bytearray(data[_PREFIX.size : _PREFIX.size + hlen + plen])
    header = json.loads(bytes(body[:hlen]))
    kind = int(rng.integers(7))
    if kind == 0:  # raw damage: the checksum must catch it
        out = bytearray(data)
        for _ in range(int(rng.integers(1, 9))):
            out[int(rng.integers(len(out)))] ^= 1 << int(rng.integers(8))
        return bytes(out)
    if kind == 1:  # truncated or spliced, unsealed
        out = bytearray(data)
        a, b = sorted(rng.integers(0, len(out), 2).tolist())
        if rng.random() < 0.5:
            return bytes(out[: a])
        return bytes(out[:a] + out[b:] + out[a:b])
    if kind == 2:  # a number of the header changed, re-sealed
        text = _bump_number(bytes(body[:hlen]).decode(), rng)
        return _seal(bytearray(text.encode()) + body[hlen:], len(text.encode()))
    arrays = [e for e in header["arrays"] if np.prod(e["shape"]) > 0]
    if not arrays:
        return _seal(body, hlen)
    e = arrays[int(rng.integers(len(arrays)))]
    dt = np.dtype(e["dtype"])
    start = hlen + e["offset"]
    nbytes = int(np.prod(e["shape"])) * dt.itemsize
    view = body[start : start + nbytes]
    if kind == 3:  # random bytes flipped inside one array, re-sealed
        for _ in range(int(rng.integers(1, 5))):
            view[int(rng.integers(len(view)))] ^= 0xFF & int(rng.integers(1, 256))
    elif kind == 4:  # one element set to an extreme value, re-sealed
        arr = np.frombuffer(view, dt).copy()
        i = int(rng.integers(arr.size))
        if dt.kind in "iu":
            info = np.iinfo(dt)
            v = int(rng.choice([info.max, info.min, -1, arr.size, arr.size + 1, 2**15, N,
                                N * 3]))
            arr.flat[i] = v % (int(info.max) + 1) if dt.kind == "u" else \
                max(int(info.min), min(int(info.max), v))
        elif dt.kind == "f":
            arr.flat[i] = rng.choice([np.nan, np.inf, -np.inf, 1e30, 0.0])
        else:
            arr.flat[i] = not arr.flat[i]
        view[:] = arr.tobytes()
    elif kind == 5:  # a run of one array copied over another place of it, re-sealed
        a, b = sorted(rng.integers(0, len(view), 2).tolist())
        n = int(rng.integers(1, max(2, min(64, len(view) - b + 1))))
        view[b : b + n] = view[a : a + n][: len(view) - b]
    else:  # one array shuffled in blocks of its items, re-sealed
        arr = np.frombuffer(view, dt).reshape(e["shape"]).copy()
        rng.shuffle(arr, axis=0)
        view[:] = arr.tobytes()
    body[start : start + nbytes] = view
    return _seal(body, hlen)


def _child(kind: str, first: int, n: int, seed: int) -> None:
    """Run cases [first, n): print 'start i' before each, 'ok i load|used|corrupt|error:...'
    after it."""
    import simsearch as ss
    from simsearch.errors import CorruptIndexError, SimsearchError

    data = build(kind)
    q = items(kind)[1]
    for i in range(first, n):
        print(f"start {i}", flush=True)
        blob = mutate(data, np.random.default_rng([seed, i]))
        if os.environ.get("FILEFUZZ_DUMP"):  # the case as a file, to replay a crash
            with open(os.environ["FILEFUZZ_DUMP"], "wb") as f:
                f.write(blob)
            with open(os.environ["FILEFUZZ_DUMP"] + ".base", "wb") as f:
                f.write(data)
        try:
            idx = ss.loads(blob)
        except CorruptIndexError:
            print(f"ok {i} corrupt", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a load must fail as CorruptIndexError only
            print(f"ok {i} error:load:{type(exc).__name__}:{str(exc)[:120]!r}", flush=True)
            continue
        try:
            idx.search(q, 5)
            idx.search(q, 5, allow=np.arange(0, 3 * N, 6))
            idx.add(q[:2], ids=[10**7, 10**7 + 1])
            idx.remove([10**7])
            idx.search(q, 5)
            print(f"ok {i} used", flush=True)
        except SimsearchError as exc:  # typed: the index says what is wrong
            print(f"ok {i} typed:{type(exc).__name__}", flush=True)
        except Exception as exc:  # noqa: BLE001 - an untyped failure: a validation gap
            print(f"ok {i} error:use:{type(exc).__name__}:{str(exc)[:120]!r}", flush=True)


def run(kind: str, n: int, seed: int = 0, timeout: float = 600.0) -> dict:
    """Every case of ``kind`` in child processes: counts by outcome, and the crashed cases."""
    outcomes: Counter = Counter()
    crashes, errors = [], []
    first = 0
    while first < n:
        proc = subprocess.run([sys.executable, __file__, "--child", kind, "--first", str(first),
                               "--n", str(n), "--seed", str(seed)],
                              capture_output=True, text=True, timeout=timeout)
        current = None
        for line in proc.stdout.splitlines():
            words = line.split(" ", 2)
            if words[0] == "start":
                current = int(words[1])
            elif words[0] == "ok":
                outcome = words[2]
                outcomes[outcome.split(":")[0]] += 1
                if outcome.startswith("error"):
                    errors.append((int(words[1]), outcome))
                current = None
        if proc.returncode == 0:
            break
        if current is None:
            raise RuntimeError(f"the {kind} child failed outside a case:\n{proc.stderr[-3000:]}")
        crashes.append((current, proc.returncode))
        outcomes["crash"] += 1
        first = current + 1
    return {"outcomes": dict(outcomes), "crashes": crashes, "errors": errors}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=",".join(KINDS))
    a = p.parse_args()
    if a.child:
        _child(a.child, a.first, a.n, a.seed)
        return 0
    bad = 0
    for kind in a.kinds.split(","):
        r = run(kind, a.n, a.seed)
        bad += len(r["crashes"]) + len(r["errors"])
        print(kind, r["outcomes"], "crashes:", r["crashes"][:5], "errors:", r["errors"][:3],
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
