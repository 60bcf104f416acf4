"""Mutated index files never crash the process (docs/architecture.md, "Persistence").

The defect: imported index bytes reached hnswlib's ``__setstate__``, faiss and numba kernels
built without bounds checks. Run on the code before these checks (2026-11-27), 300 mutated
files per kind crashed the child process 48 times for hnsw (segfaults in hnswlib), 8-9 times
for ip-NSW+ and once for Pyramid (an abort), and 22 more cases failed with untyped errors
(IndexError, ValueError) instead of CorruptIndexError. The harness is tests/filefuzz.py.
"""

from __future__ import annotations

import os

import pytest

from filefuzz import KINDS, run

#: mutated files per kind (10 kinds: 5,000 files)
PER_KIND = int(os.environ.get("SIMSEARCH_FILE_FUZZ", "500"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_mutated_files_give_corrupt_index_error_or_a_working_index(kind):
    r = run(kind, PER_KIND, seed=1)
    assert r["crashes"] == [] and r["errors"] == [], r
    assert sum(r["outcomes"].values()) == PER_KIND
    assert r["outcomes"].get("corrupt", 0) > PER_KIND // 4  # the validators did refuse files
