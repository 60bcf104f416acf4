"""Bounded work per request (docs/architecture.md, "Bounded work"): oversized searches are refused
before any large allocation, and every bad search parameter gets a typed error."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from contract import CASES, dim_of, items_of
from simsearch.errors import InvalidParameterError, SimsearchError

BAD_VALUES = ["x", 1.5, -5, 0, [1], None, True, 10**12, {"a": 1}]


def test_the_issue_case_is_refused_in_process():
    idx = ss.FlatIndex(8, "ip")
    idx.add(np.ones((100, 8), np.float32))
    q = np.ones((5000, 8), np.float32)
    with pytest.raises(InvalidParameterError, match="SIMSEARCH_MAX_RESULT_ENTRIES"):
        idx.search(q, 100_000)  # 5e8 entries: several GiB of padding
    r = idx.search(q[:10], 100_000)  # within the limit: sized by the 100 items, then padded
    assert r.ids.shape == (10, 100_000) and (r.ids[:, 100:] == -1).all()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_search_parameters_are_typed(case):
    x, _ = items_of(case, 400, 3, 16, 0)
    idx = case.make(dim_of(case, 16), case.metrics[0], x)
    idx.add(x)
    for name in sorted(idx.capabilities.search_params):
        for value in BAD_VALUES:
            try:
                r = idx.search(x[:3], 5, **{name: value})
            except SimsearchError:
                continue  # typed: fine
            except Exception as exc:
                pytest.fail(f"{case.id}: {name}={value!r} raised untyped {type(exc).__name__}: "
                            f"{exc}")
            assert r.ids.shape == (3, 5)  # accepted (e.g. capped to the item count)
