"""CNNEDEncoder: strings -> 128-d float32 vectors whose L2 distances approximate edit distance
(divided by the training set's mean edit distance)."""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from ..errors import CorruptIndexError, InvalidParameterError, NotTrainedError
from ..fileformat import read_index_bytes, read_index_file, write_index_bytes, write_index_file
from ..index import check_int
from ._alphabet import Alphabet, check_strings

log = logging.getLogger(__name__)

FILE_CLASS = "cnned-encoder"
SHORT_STRINGS = 64  # mean length up to which training neighbours are searched exhaustively


class CNNEDEncoder:
    """Convolutional edit-distance embedding (Dai et al., SIGIR 2020).

    Parameters
    ----------
    alphabet : the fixed set of characters (None: learned by :meth:`fit` from its strings).
        Strings with other characters are refused with UnknownCharacterError.
    max_len : one-hot length (the paper's M); longer strings are truncated for embedding only.
    embed_dim : embedding dimension (paper: 128).
    n_layers : number of [conv -> pool] layers; None follows ``max_len``
        (:func:`default_n_layers`: 1 for words, 6 for length 1,024).
    channels : convolution channels; None: 8 (the paper's) in the per-character layout of
        shallow stacks, 32 in the channel-input layout of deep ones (see ``CNNEDNet``), where
        8 channels would have to describe all characters at once.
    global_channels : whole-string bigram features (kernel-2 convolution, ReLU, mean over
        positions) added before the linear layer; None: 128 for deep stacks without the profile
        path, else 0.
    profile : add the letter / letter-pair count path (see ``CNNEDNet``; not in the paper);
        None: on for deep stacks (long strings), off for shallow ones (words).
    seed : seeds the weights, the triplet sampling and the validation split.

    Training and encoding are deterministic on the CPU for a given seed and thread count; they
    set torch's thread count and deterministic mode for their duration and restore them after,
    so do not run them concurrently with other torch work in the same process.

    >>> from simsearch.strings import CNNEDEncoder
    >>> enc = CNNEDEncoder(alphabet="acgt", max_len=8, embed_dim=16)
    >>> enc = enc.fit(["acgt", "aagt", "ccgt", "acga", "ttga", "gatc"] * 5, epochs=1,
    ...               progress=False)
    >>> enc.encode(["acgt", "gattaca"]).shape   # l2 distances that track edit distances
    (2, 16)
    """

    def __init__(self, alphabet: str | None = None, max_len: int = 32, embed_dim: int = 128,
                 n_layers: int | None = None, channels: int | None = None,
                 global_channels: int | None = None, profile: bool | None = None,
                 seed: int = 0):
        self.max_len = check_int("max_len", max_len, 1, 1 << 16)
        self.embed_dim = check_int("embed_dim", embed_dim, 1, 1 << 14)
        self.seed = check_int("seed", seed, 0)
        if n_layers is None:
            from .model import default_n_layers

            n_layers = default_n_layers(self.max_len)
        self.n_layers = check_int("n_layers", n_layers, 1, 16)
        if channels is None:  # the paper's 8 per character row; 32 shared channels when deep
            channels = 8 if self.n_layers <= 2 else 32
        self.channels = check_int("channels", channels, 1, 1024)
        if profile is None:
            profile = self.n_layers > 2
        if global_channels is None:  # whole-string features for long strings (see CNNEDNet)
            # the profile path holds every letter pair's count already: measured on proteins,
            # dropping the 128-channel branch kept recall@10 (0.765 against 0.771 at T = 2,000
            # with 10,000 against 6,000 anchors) at twice the embedding speed and half the
            # training time per anchor
            global_channels = 0 if self.n_layers <= 2 or profile else 128
        self.global_channels = check_int("global_channels", global_channels, 0, 4096)
        if not isinstance(profile, (bool, np.bool_)):
            raise InvalidParameterError(f"profile must be a bool or None; got {profile!r}")
        self.profile = bool(profile)
        self.alphabet = Alphabet(alphabet) if alphabet is not None else None
        self.mean_distance: float | None = None  # the training set's mean edit distance
        self.report = None  # TrainReport of the last fit()
        self._net = None

    def __repr__(self) -> str:
        return (f"CNNEDEncoder(max_len={self.max_len}, embed_dim={self.embed_dim}, "
                f"n_layers={self.n_layers}, channels={self.channels}, "
                f"global_channels={self.global_channels}, profile={self.profile}, "
                f"seed={self.seed}, "
                f"alphabet={len(self.alphabet) if self.alphabet else None} chars, "
                f"trained={self.is_trained})")

    @property
    def is_trained(self) -> bool:
        return self.mean_distance is not None

    @property
    def dim(self) -> int:
        return self.embed_dim

    def _build(self, device: str | None = None):
        """The network for these parameters (``device="meta"``: shapes only, no memory)."""
        import torch

        from .model import CNNEDNet

        with torch.device(device or "cpu"):
            net = CNNEDNet(len(self.alphabet), self.max_len, self.embed_dim, self.n_layers,
                           self.channels, self.global_channels, self.profile)
        if device is None:
            self._net = net
        return net

    def fit(self, strings: list[str], epochs: int = 10, batch_size: int = 64,
            n_train: int | None = None, n_neighbors: int = 100, neighbours: str = "pool",
            n_candidates: int = 500, n_pool: int | None = None, learning_rate: float = 1e-3,
            early_stopping: int | None = None, validation_fraction: float = 0.1,
            approx_form: str | None = None, far_fraction: float | None = None,
            n_threads: int = 1,
            progress: bool = True) -> CNNEDEncoder:
        """Train on ``strings``.

        epochs : passes over the training anchors (each draws fresh triplets).
        n_train : number of anchors (a seeded sample of the distinct strings); None: 3,000 for
            shallow stacks (words), 10,000 for deep ones (measured on proteins: recall@10 at
            T = 2,000 0.771 with 6,000 against 0.742 with 3,000).
        n_neighbors : the paper's 2K: each anchor's two partners come from its 2K nearest.
        neighbours : where the 2K nearest are sought. "pool" (default): among all distinct
            strings (or a seeded sample of ``n_pool``), through ``n_candidates`` bigram-profile
            candidates per anchor re-ranked by exact edit distance, so that close pairs occur
            at their real frequency. "sample": exactly, among the anchors only (the paper's
            code); on sparse data (proteins) such a sample holds almost no close pairs.
        n_candidates : candidates per anchor for "pool"; ignored (exact against the whole
            pool) when the strings' mean length is at most 64, where that is cheaper.
        early_stopping : patience in epochs on held-out anchors' triplet loss (None: off).
        approx_form : the approximation term (``training.cnned_loss``): "paper" (squared error),
            "relative" or "log"; None: "paper" for shallow stacks (words), "log" for deep.
        far_fraction : share of triplets whose negative is a random string of the whole pool
            rather than one of the 2K nearest (``training.sample_triplets``); None: 0 (the
            paper's sampling) for shallow stacks, 0.8 for deep.
        n_threads : torch and rapidfuzz threads.
        """
        from . import model as M
        from . import training as T

        strings = check_strings(strings)
        epochs = check_int("epochs", epochs, 1, 100_000)
        batch_size = check_int("batch_size", batch_size, 1, 1 << 16)
        if n_train is None:
            n_train = 3000 if self.n_layers <= 2 else 10_000
        n_train = check_int("n_train", n_train, 3)
        n_neighbors = check_int("n_neighbors", n_neighbors, 2)
        n_threads = check_int("n_threads", n_threads, 1, 1024)
        if early_stopping is not None:
            early_stopping = check_int("early_stopping", early_stopping, 1)
        if not 0.0 < validation_fraction < 0.5:
            raise InvalidParameterError(
                f"validation_fraction must be in (0, 0.5); got {validation_fraction}")
        if not learning_rate > 0:
            raise InvalidParameterError(f"learning_rate must be > 0; got {learning_rate}")
        uniq = sorted(set(strings))
        if len(uniq) < 3:
            raise InvalidParameterError(
                f"training needs at least 3 distinct strings; got {len(uniq)}")
        if self.alphabet is None:
            self.alphabet = Alphabet.from_strings(uniq)
        if neighbours not in ("pool", "sample"):
            raise InvalidParameterError(
                f"neighbours must be 'pool' or 'sample'; got {neighbours!r}")
        n_candidates = check_int("n_candidates", n_candidates, 1)
        if approx_form is None:
            approx_form = "paper" if self.n_layers <= 2 else "log"
        if far_fraction is None:
            far_fraction = 0.0 if self.n_layers <= 2 else 0.8
        if not 0.0 <= far_fraction <= 1.0:
            raise InvalidParameterError(f"far_fraction must be in [0, 1]; got {far_fraction}")
        if approx_form not in T.APPROX_FORMS:
            raise InvalidParameterError(
                f"approx_form must be one of {T.APPROX_FORMS}; got {approx_form!r}")
        rng = np.random.default_rng(self.seed)
        t0 = time.perf_counter()
        if neighbours == "sample":
            pick = np.sort(rng.choice(len(uniq), min(n_train, len(uniq)), replace=False))
            pool = [uniq[i] for i in pick]
            codes, _ = self.alphabet.encode(pool, self.max_len, "training strings")
            nb = T.nearest_neighbours(pool, n_neighbors, workers=n_threads, progress=progress)
        else:
            if n_pool is not None and check_int("n_pool", n_pool, 3) < len(uniq):
                uniq = [uniq[i] for i in np.sort(rng.choice(len(uniq), n_pool, replace=False))]
            pool = uniq
            # neighbours and the mean distance are taken on the strings as embedded
            codes, lengths = self.alphabet.encode(pool, self.max_len, "training strings")
            pool = [s[: self.max_len] for s in pool]
            anchors = np.sort(rng.choice(len(pool), min(n_train, len(pool)), replace=False))
            if lengths.mean() <= SHORT_STRINGS:  # exact distances are cheaper than the filter
                n_candidates = None
            nb = T.pool_neighbours(pool, codes, lengths, len(self.alphabet), anchors,
                                   n_neighbors, n_candidates,
                                   seed=self.seed, workers=n_threads, progress=progress)
        t_nb = time.perf_counter() - t0
        log.info("neighbours of %d anchors among %d strings in %.1f s; mean edit distance %.3f",
                 nb.ids.shape[0], len(pool), t_nb, nb.mean_distance)
        with M.torch_session(n_threads, self.seed):
            net = self._build()
            report = T.train(net, codes, pool, nb, epochs=epochs,
                             batch_size=batch_size, learning_rate=learning_rate,
                             early_stopping=early_stopping,
                             validation_fraction=validation_fraction, seed=self.seed,
                             approx_form=approx_form, far_fraction=far_fraction,
                             progress=progress)
        report.neighbour_seconds = t_nb
        self.report = report
        self.mean_distance = nb.mean_distance
        return self

    def encode(self, strings: list[str], batch_size: int = 2048, n_threads: int = 1) -> np.ndarray:
        """Embeddings float32 (n, embed_dim). Strings are checked against the alphabet first."""
        from . import model as M

        strings = check_strings(strings)
        if not self.is_trained:
            raise NotTrainedError("CNNEDEncoder must be fit() (or loaded) before encode()")
        batch_size = check_int("batch_size", batch_size, 1)
        n_threads = check_int("n_threads", n_threads, 1, 1024)
        codes, _ = self.alphabet.encode(strings, self.max_len)
        out = np.empty((len(strings), self.embed_dim), np.float32)
        import torch

        with M.torch_session(n_threads), torch.inference_mode():
            for s in range(0, len(strings), batch_size):
                x = self._net.inputs(codes[s : s + batch_size])
                out[s : s + batch_size] = self._net(*x).numpy()
        return out

    # -- persistence --------------------------------------------------------------------------

    def _state(self) -> tuple[dict, dict[str, np.ndarray]]:
        if not self.is_trained:
            raise NotTrainedError("an untrained CNNEDEncoder has nothing to save")
        from .model import state_to_numpy

        header = {
            "class": FILE_CLASS, "metric": "l2", "dim": self.embed_dim, "count": 0,
            "params": {"alphabet": self.alphabet.chars, "max_len": self.max_len,
                       "embed_dim": self.embed_dim, "n_layers": self.n_layers,
                       "channels": self.channels, "global_channels": self.global_channels,
                       "profile": self.profile, "seed": self.seed},
            "meta": {"mean_distance": self.mean_distance},
        }
        return header, state_to_numpy(self._net)

    @classmethod
    def _from_state(cls, header: dict, arrays: dict[str, np.ndarray], where: str) -> CNNEDEncoder:
        from .model import state_from_numpy

        try:
            if header.get("class") != FILE_CLASS:
                raise ValueError(f"holds a {header.get('class')!r}, not a {FILE_CLASS!r}")
            # files written before the global branch and the profile path
            enc = cls(**{"global_channels": 0, "profile": False, **header["params"]})
            # the header's network sized without allocating it: a crafted header asking for a
            # huge one (a 1.6 KB file peaked at 1.5 GB) must fail before anything is allocated
            want = {k: tuple(v.shape) for k, v in enc._build("meta").state_dict().items()}
            have = {k: tuple(a.shape) for k, a in arrays.items()}
            if want != have:
                n = sum(int(np.prod(s)) for s in want.values())
                raise ValueError(f"its header describes a network of {n} weights that the "
                                 "arrays it holds do not match")
            enc._build()
            state_from_numpy(enc._net, arrays)
            enc._net.eval()
            enc.mean_distance = float(header["meta"]["mean_distance"])
        except Exception as exc:  # a file that parses but does not describe an encoder
            raise CorruptIndexError(f"{where} could not be restored as a CNNEDEncoder: {exc}") \
                from None
        return enc

    def save(self, path: str | os.PathLike) -> None:
        """One checksummed file, written atomically (weights as raw arrays; no pickle)."""
        header, arrays = self._state()
        write_index_file(path, header, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CNNEDEncoder:
        header, arrays = read_index_file(path)
        return cls._from_state(header, arrays, str(path))

    def to_bytes(self) -> bytes:
        """The bytes ``save`` writes."""
        return write_index_bytes(*self._state())

    @classmethod
    def loads(cls, data: bytes | bytearray | memoryview) -> CNNEDEncoder:
        header, arrays = read_index_bytes(bytearray(data), "the encoder bytes")
        return cls._from_state(header, arrays, "the encoder bytes")
