"""runtime.executor.mask_columns: a step's candidates are exactly each row's masks before its block end."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.runtime.executor import mask_columns

MASK = 7


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([1, 2, MASK]), min_size=6, max_size=6), min_size=1, max_size=4),
       data=st.data())
def test_candidates_are_each_rows_masks_before_hi(rows: list[list[int]], data: st.DataObject) -> None:
    x = np.array(rows, dtype=np.int64)
    hi = np.array([data.draw(st.integers(0, 6)) for _ in rows])
    cols = mask_columns(x, hi, MASK)
    assert cols.dtype == np.int64 and cols.shape[0] == x.shape[0] and cols.shape[1] >= 1
    for b in range(x.shape[0]):
        want = [c for c in range(6) if x[b, c] == MASK and c < hi[b]]
        got = cols[b].tolist()
        # In column order, then padded by repeating the last one (column 0 for a row with none).
        assert got[: len(want)] == want
        assert set(got[len(want) :]) <= {want[-1] if want else 0}
    assert cols.shape[1] == max(1, max(len([c for c in range(h) if x[b, c] == MASK]) for b, h in enumerate(hi)))
    # Without hi: every mask of the row (step zero's candidates).
    assert mask_columns(x, None, MASK)[0].tolist()[: int((x[0] == MASK).sum())] == np.flatnonzero(x[0] == MASK).tolist()
