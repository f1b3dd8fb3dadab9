"""Streaming: each row's settled response prefix (the ids before its first mask, which no later pass changes: a
committed token is never re-masked), told to a hook as it grows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# (batch row, the row's settled response prefix). Called from the loop's thread after a pass that grew the prefix.
SettledHook = Callable[[int, np.ndarray], None]


class SettledPrefixes:
    """The settled prefix length of each row of a group (`batch_rows`: their rows in the batch), reported to `hook`
    (None: nothing is tracked) as it grows."""

    def __init__(self, hook: SettledHook | None, mask_id: int, batch_rows: Sequence[int]) -> None:
        self.hook, self.mask_id, self.batch_rows = hook, mask_id, list(batch_rows)
        self.length = np.zeros(len(self.batch_rows), np.int64)

    def report(self, x: np.ndarray, prompt_width: int, kept: np.ndarray, rows: np.ndarray) -> None:
        """Tell the hook each of `rows` whose prefix grew: x [n, P + K] the group's sequence, kept [n] its rows' kept
        response lengths."""
        if self.hook is None:
            return
        for i in rows:
            response = x[i, prompt_width : prompt_width + int(kept[i])]
            masked = np.flatnonzero(response == self.mask_id)
            n = int(masked[0]) if masked.size else int(kept[i])
            if n > self.length[i]:
                self.length[i] = n
                self.hook(self.batch_rows[i], response[:n].copy())
