"""How much of the data must any exact MIPS bound read? The floor under an exact index's speed.

    python -m bench.diagnostics.exact_bounds [--datasets ml100k-svd synthetic-longtail]

An exact search may skip an item only when an upper bound on q·x is below the query's k-th best
score s_k. For each bound family this prints the mean fraction of items whose bound is at or above
s_k: those must be scored whatever the order of the scan, so 1/fraction caps the speed-up over
reading everything. Bounds: Cauchy–Schwarz |q||x| (NormScanIndex, NormIVFIndex); the first p
principal coordinates exact plus |q_rest||x_rest| (a partial-distance bound, which itself costs
p/dim of a full scan); balls around k-means cells, q·c + ‖q‖ r (a ball or cone tree's leaves).
"""

from __future__ import annotations

import argparse
import sys

import faiss
import numpy as np

from simsearch.datasets import load
from simsearch.eval import markdown_table


def fractions(x: np.ndarray, q: np.ndarray, k: int) -> list[dict]:
    x, q = x.astype(np.float64), q.astype(np.float64)
    s = q @ x.T
    sk = -np.partition(-s, k - 1, axis=1)[:, k - 1][:, None]
    xn, qn = np.linalg.norm(x, axis=1), np.linalg.norm(q, axis=1)
    rows = [{"bound": "Cauchy-Schwarz ‖q‖‖x‖", "must read": ((qn[:, None] * xn) >= sk).mean()}]
    _, v = np.linalg.eigh(x.T @ x)  # uncentred: the directions carrying the inner products
    xr, qr = x @ v[:, ::-1], q @ v[:, ::-1]
    for p in (4, 16, 32):
        ub = qr[:, :p] @ xr[:, :p].T + np.linalg.norm(qr[:, p:], axis=1)[:, None] * \
            np.linalg.norm(xr[:, p:], axis=1)
        rows.append({"bound": f"first {p} principal coordinates + ‖q_rest‖‖x_rest‖",
                     "must read": (ub >= sk).mean(), "bound's own cost": p / x.shape[1]})
    for cells in (32, 128):
        km = faiss.Kmeans(x.shape[1], cells, niter=20, seed=1)
        km.train(x.astype(np.float32))
        a = km.index.search(x.astype(np.float32), 1)[1][:, 0]
        c = np.stack([x[a == j].mean(0) if (a == j).any() else np.zeros(x.shape[1])
                      for j in range(cells)])
        r = np.array([np.linalg.norm(x[a == j] - c[j], axis=1).max() if (a == j).any() else 0
                      for j in range(cells)])
        need = (q @ c.T + qn[:, None] * r) >= sk
        rows.append({"bound": f"balls around {cells} k-means cells",
                     "must read": (need * np.bincount(a, minlength=cells)).sum(1).mean() / len(x)})
    for row in rows:
        row["speed-up cap"] = 1 / max(row["must read"] + row.get("bound's own cost", 0), 1e-9)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["ml100k-svd"])
    p.add_argument("--k", type=int, default=10)
    args = p.parse_args(argv)
    for name in args.datasets:
        params = {"n": 200_000, "dim": 64, "n_queries": 300} if name.startswith("synth") else {}
        d = load(name, **params)
        print(f"\n{name}: {d.base.shape[0]} x {d.base.shape[1]}, k={args.k}")
        print(markdown_table(fractions(d.base, d.queries, args.k),
                             ["bound", "must read", "bound's own cost", "speed-up cap"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
