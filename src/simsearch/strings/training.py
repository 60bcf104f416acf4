"""CNN-ED training: neighbour lists by exact edit distance, triplet sampling, the loss (triplet
with the edit-distance-gap margin plus the approximation term) and its weight schedule."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from .brute import edit_distance_matrix
from .cgk import smallest_k

log = logging.getLogger(__name__)

# (triplet weight, approximation weight) per fifth of the epochs: the approximation term first
# sets the scale of the embedding (distances ~ edit distance / mean), then the triplet term
# takes over and refines the ranking near each anchor, which is what top-k search needs.
SCHEDULE = ((1.0, 10.0), (10.0, 10.0), (10.0, 1.0), (5.0, 0.1), (1.0, 0.01))


def schedule_weights(epoch: int, n_epochs: int) -> tuple[float, float]:
    """(triplet, approximation) weights of ``epoch`` (0-based) in a run of ``n_epochs``."""
    phase = min(len(SCHEDULE) - 1, epoch * len(SCHEDULE) // max(n_epochs, 1))
    return SCHEDULE[phase]


APPROX_FORMS = ("paper", "relative", "log")
LOG_EPS = 0.05  # in units of the mean distance: below it, log error treats distances alike


def cnned_loss(
    ea: torch.Tensor, ep: torch.Tensor, en: torch.Tensor,
    d_ap: torch.Tensor, d_an: torch.Tensor, d_pn: torch.Tensor,
    w_triplet: float, w_approx: float, approx_form: str = "paper",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss of a batch of triplets. ``ea``, ``ep``, ``en`` (B, d) embeddings of anchor, positive,
    negative; ``d_*`` (B,) edit distances already divided by the training set's mean.

    triplet  = mean relu(|ea - ep| - |ea - en| + (d_an - d_ap))     margin: the true gap
    approx ("paper")    = mean sqrt((|ea-ep| - d_ap)^2 + (|ea-en| - d_an)^2 + (|ep-en| - d_pn)^2)
    approx ("relative") = mean over the three pairs of |e - d| / d
    approx ("log")      = mean over the three pairs of |log(e + eps) - log(d + eps)|, eps = 0.05
    total    = w_triplet * triplet + w_approx * approx
    The paper's form weighs an error of x edits alike at every distance, so the close pairs that
    decide the top 10 of long strings (about 0.4 of the mean distance) are fitted no better
    than far ones; the relative and log forms weigh errors by the inverse of the distance.
    Returns (total, triplet, approx)."""
    e_ap = _dist(ea, ep)
    e_an = _dist(ea, en)
    e_pn = _dist(ep, en)
    triplet = F.relu(e_ap - e_an + (d_an - d_ap)).mean()
    e, d = torch.stack([e_ap, e_an, e_pn]), torch.stack([d_ap, d_an, d_pn])
    if approx_form == "paper":
        approx = torch.sqrt(((e - d) ** 2).sum(0) + 1e-12).mean()
    elif approx_form == "relative":
        approx = ((e - d).abs() / d.clamp_min(1e-6)).mean()
    elif approx_form == "log":
        approx = (torch.log(e + LOG_EPS) - torch.log(d + LOG_EPS)).abs().mean()
    else:
        raise ValueError(f"approx_form must be one of {APPROX_FORMS}; got {approx_form!r}")
    return w_triplet * triplet + w_approx * approx, triplet, approx


def _dist(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # +eps keeps the gradient finite when two embeddings coincide
    return torch.sqrt(((a - b) ** 2).sum(1) + 1e-12)


@dataclass
class Neighbours:
    """Row r: anchor ``anchors[r]`` and its ``n_neighbors`` nearest others by edit distance
    (``ids`` into the same string list, ascending ``dists`` int32); ``mean_distance`` is the
    mean edit distance between two strings of the list (the normalising scale)."""

    ids: np.ndarray
    dists: np.ndarray
    mean_distance: float
    anchors: np.ndarray | None = None

    def __post_init__(self):
        if self.anchors is None:
            self.anchors = np.arange(self.ids.shape[0])


def nearest_neighbours(strings: list[str], n_neighbors: int, workers: int = -1,
                       block: int = 256, progress: bool = True) -> Neighbours:
    """Exact neighbour lists of a training sample (rapidfuzz, in row blocks)."""
    from tqdm.auto import tqdm

    n = len(strings)
    kk = min(n_neighbors, n - 1)
    ids = np.empty((n, kk), np.int64)
    dists = np.empty((n, kk), np.int32)
    total = 0.0
    big = np.iinfo(np.int32).max
    with tqdm(total=n, desc="edit-distance neighbours", unit="str", leave=False,
              disable=not progress or None) as bar:
        for s in range(0, n, block):
            d = edit_distance_matrix(strings[s : s + block], strings, workers)
            total += float(d.sum(dtype=np.float64))
            rows = np.arange(d.shape[0])
            d[rows, s + rows] = big  # not one's own neighbour
            ids[s : s + block], dists[s : s + block] = smallest_k(d, kk)
            bar.update(d.shape[0])
    mean = total / max(n * (n - 1), 1)
    return Neighbours(ids, dists, max(mean, 1e-6))


def bigram_profiles(codes: np.ndarray, lengths: np.ndarray, n_chars: int,
                    max_buckets: int = 2048) -> np.ndarray:
    """Bigram counts float32 (n, min((n_chars + 1)**2, max_buckets)), hashed past the cap."""
    from . import _kernels as K

    stride = n_chars + 1
    out = np.zeros((codes.shape[0], min(stride * stride, max_buckets)), np.float32)
    K.bigram_profile(codes, lengths, stride, out.shape[1], out)
    return out


def pool_neighbours(strings: list[str], codes: np.ndarray, lengths: np.ndarray, n_chars: int,
                    anchors: np.ndarray, n_neighbors: int, n_candidates: int | None,
                    max_buckets: int = 2048, n_mean_pairs: int = 20_000, seed: int = 0,
                    workers: int = 1, block: int = 256, progress: bool = True) -> Neighbours:
    """Neighbour lists of ``anchors`` among the whole pool ``strings``, so that close pairs
    appear at their real frequency (a small sample of a sparse set such as proteins holds
    almost none). ``n_candidates`` None: exact, against every string. Otherwise candidates:
    the ``n_candidates`` nearest by bigram-count profile (L2; measured on proteins: recall@10
    0.81 among 2,000 such candidates, CGK 0.53), then exact edit distances (rapidfuzz) pick
    the ``n_neighbors`` (the paper's 2K) nearest. The mean edit distance is estimated on
    ``n_mean_pairs`` random pairs."""
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    n = len(strings)
    kk = min(n_neighbors, n - 1)
    ids = np.empty((anchors.size, kk), np.int64)
    dists = np.empty((anchors.size, kk), np.int32)
    exact = n_candidates is None or n_candidates >= n - 1
    if not exact:
        n_candidates = max(n_candidates, kk)
        prof = bigram_profiles(codes, lengths, n_chars, max_buckets)
        sq = (prof.astype(np.float64) ** 2).sum(1).astype(np.float32)
    with tqdm(total=anchors.size, desc="edit-distance neighbours", unit="str", leave=False,
              disable=not progress or None) as bar:
        for s in range(0, anchors.size, block):
            a = anchors[s : s + block]
            if exact:  # every string is a candidate
                d = edit_distance_matrix([strings[i] for i in a.tolist()], strings, workers)
                d[np.arange(a.size), a] = np.iinfo(np.int32).max  # not one's own neighbour
                ids[s : s + block], dists[s : s + block] = smallest_k(d, kk)
                bar.update(a.size)
                continue
            with threadpool_limits(max(workers, 1)):
                d2 = sq[a, None] + sq[None, :] - 2.0 * (prof[a] @ prof.T)
            d2[np.arange(a.size), a] = np.inf  # not one's own neighbour
            cand = np.argpartition(d2, n_candidates - 1, axis=1)[:, :n_candidates]
            for r, row in enumerate(cand):
                row = np.sort(row)
                ed = cdist([strings[a[r]]], [strings[j] for j in row.tolist()],
                           scorer=Levenshtein.distance, dtype=np.int32, workers=workers)[0]
                order = np.lexsort((row, ed))[:kk]
                ids[s + r], dists[s + r] = row[order], ed[order]
            bar.update(a.size)
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, n_mean_pairs)
    j = (i + rng.integers(1, n, n_mean_pairs)) % n
    mean = float(np.mean([Levenshtein.distance(strings[x], strings[y])
                          for x, y in zip(i.tolist(), j.tolist(), strict=True)]))
    return Neighbours(ids, dists, max(mean, 1e-6), np.asarray(anchors, np.int64))


def sample_triplets(nb: Neighbours, anchors: np.ndarray, rng: np.random.Generator,
                    far_fraction: float = 0.0, n_pool: int | None = None):
    """``anchors``: rows of ``nb``. For each, two distinct random neighbours among its 2K
    nearest; the closer (by edit distance) is the positive. Returns (anchor, positive,
    negative) ids and d_ap, d_an.

    With ``far_fraction`` > 0 (not in the paper), that share of the triplets takes its negative
    uniformly from the whole pool of ``n_pool`` strings instead (its d_an is returned as -1, to
    be computed by the caller). Neighbour lists alone only constrain the nearest 0.2% of a
    50,000-string base, while search must also keep the rest of it out of the top T."""
    kk = nb.ids.shape[1]
    i1 = rng.integers(0, kk, anchors.size)
    i2 = rng.integers(0, kk - 1, anchors.size)
    i2 += i2 >= i1
    lo, hi = np.minimum(i1, i2), np.maximum(i1, i2)  # lists are sorted: lower rank is closer
    a = nb.anchors[anchors]
    p, ng = nb.ids[anchors, lo], nb.ids[anchors, hi]
    dap, dan = nb.dists[anchors, lo], nb.dists[anchors, hi].copy()
    if far_fraction > 0:
        far = rng.random(anchors.size) < far_fraction
        p = np.where(far, nb.ids[anchors, i1], p)
        dap = np.where(far, nb.dists[anchors, i1], dap)
        other = rng.integers(1, n_pool, anchors.size)
        ng = np.where(far, (a + other) % n_pool, ng)  # never the anchor itself
        dan[far] = -1
    return a, p, ng, dap, dan


@dataclass
class TrainReport:
    epochs_run: int = 0
    seconds: float = 0.0
    neighbour_seconds: float = 0.0
    history: list[dict] = field(default_factory=list)
    stopped_early: bool = False


def train(net, codes: np.ndarray, strings: list[str], nb: Neighbours, *, epochs: int,
          batch_size: int, learning_rate: float, early_stopping: int | None,
          validation_fraction: float, seed: int, approx_form: str = "paper",
          far_fraction: float = 0.0, progress: bool = True) -> TrainReport:
    """Adam over freshly sampled triplets every epoch. With ``early_stopping`` (patience in
    epochs) a held-out set of anchors is scored after each epoch by its triplet term (weights
    apart) and training stops when it has not improved by 0.5% for that many epochs; the best
    weights are kept."""
    from rapidfuzz.distance import Levenshtein
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    n = nb.ids.shape[0]  # anchors (rows of nb); codes and strings cover the whole pool
    perm = rng.permutation(n)
    n_val = int(round(validation_fraction * n)) if early_stopping else 0
    val_anchors, train_anchors = np.sort(perm[:n_val]), np.sort(perm[n_val:])
    scale = nb.mean_distance
    opt = torch.optim.Adam(net.parameters(), lr=learning_rate)

    if net.prof is not None:  # start from the projected profile (see CNNEDNet)
        sample = np.sort(rng.choice(codes.shape[0], min(2000, codes.shape[0]), replace=False))
        net.init_profile(net.profile_features(codes[sample]), seed)

    def ed(xs, ys):
        pairs = zip(xs.tolist(), ys.tolist(), strict=True)
        return np.fromiter((Levenshtein.distance(strings[x], strings[y]) for x, y in pairs),
                           np.int32, count=len(xs))

    def batch_tensors(a, p, ng, dap, dan):
        far = dan < 0
        if far.any():  # random negatives: their distance, and the closer one is the positive
            dan = dan.copy()
            dan[far] = ed(a[far], ng[far])
            swap = dan < dap
            p, ng = np.where(swap, ng, p), np.where(swap, p, ng)
            dap, dan = np.minimum(dap, dan), np.maximum(dap, dan)
        dpn = ed(p, ng)
        emb = net(*net.inputs(np.concatenate([codes[a], codes[p], codes[ng]])))
        b = len(a)
        d = [torch.from_numpy(np.asarray(v, np.float32) / scale) for v in (dap, dan, dpn)]
        return emb[:b], emb[b : 2 * b], emb[2 * b :], d

    n_pool = codes.shape[0]
    val = (sample_triplets(nb, val_anchors, np.random.default_rng(seed + 1), far_fraction,
                           n_pool) if n_val else None)
    report = TrainReport()
    best, best_state, stale = np.inf, None, 0
    t0 = time.perf_counter()
    n_batches = -(-train_anchors.size // batch_size)
    with tqdm(total=epochs * n_batches, desc="CNN-ED training", unit="batch", leave=False,
              disable=not progress or None) as bar:
        for epoch in range(epochs):
            w_t, w_a = schedule_weights(epoch, epochs)
            net.train()
            anchors = rng.permutation(train_anchors)
            tri = sample_triplets(nb, anchors, rng, far_fraction, n_pool)
            sums = np.zeros(3)
            for s in range(0, anchors.size, batch_size):
                sl = slice(s, s + batch_size)
                ea, ep, en, (dap, dan, dpn) = batch_tensors(*(v[sl] for v in tri))
                loss, lt, la = cnned_loss(ea, ep, en, dap, dan, dpn, w_t, w_a, approx_form)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sums += (loss.item(), lt.item(), la.item())
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.4f}", triplet=f"{lt.item():.4f}",
                                approx=f"{la.item():.4f}")
            row = dict(zip(("loss", "triplet", "approx"), (sums / n_batches).tolist(), strict=True),
                       epoch=epoch, w_triplet=w_t, w_approx=w_a)
            if val is not None:
                net.eval()
                with torch.no_grad():
                    vt = 0.0
                    for s in range(0, val[0].size, 1024):
                        ea, ep, en, (dap, dan, dpn) = batch_tensors(*(v[s : s + 1024] for v in val))
                        vt += cnned_loss(ea, ep, en, dap, dan, dpn, 1.0, 0.0)[1].item() * len(dap)
                row["val_triplet"] = vt / val[0].size
            report.history.append(row)
            log.info("epoch %d: %s", epoch, row)
            report.epochs_run = epoch + 1
            if val is not None:
                if row["val_triplet"] < best * 0.995:
                    best, stale = row["val_triplet"], 0
                    best_state = {k: v.clone() for k, v in net.state_dict().items()}
                else:
                    stale += 1
                    if stale >= early_stopping:
                        report.stopped_early = True
                        break
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    report.seconds = time.perf_counter() - t0
    return report
