"""The Dream family's sampler over a group of batch rows (runtime.rules decides each pass, runtime.executor runs it):
each row's one block over its kept slots, its passes counted by its RuleCursor; the candidates are every mask before
the kept slots' end, the prompt's included, as the authors' `mask_index` is."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from seer_deploy.runtime.executor import LoopContext, Rows, Tally, _Group
from seer_deploy.runtime.rules import rule_cursor
from seer_deploy.runtime.settled import SettledPrefixes


def run_rule_group(ctx: LoopContext, rows: Rows, tally: Tally, batch_rows: Sequence[int] | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`executor.run_group` under the Dream family's sampler: the responses int64 [n, gen_length] and the passes each
    row made."""
    group = _Group.start(ctx, rows)
    prompt_masks = np.zeros(group.n, np.int64) if rows.prompt_masks is None else rows.prompt_masks
    cursors = [rule_cursor(ctx.config, plan.blocks[0].steps, plan.kept, int(prompt_masks[i]))
               for i, plan in enumerate(rows.plans)]
    settled = SettledPrefixes(ctx.on_settled, ctx.mask_id, list(batch_rows) if batch_rows is not None
                              else list(range(group.n)))
    settled.report(group.x, group.prompt_width, group.kept, np.arange(group.n))  # what step zero already settled
    hi = group.prompt_width + group.kept
    while True:
        left = ctx.core.masks_left(group.x, np.zeros(group.n, np.int64), hi, ctx.mask_id)
        counts = [cursor.next(ctx.core, ctx.config, int(m)) for cursor, m in zip(cursors, left, strict=True)]
        if all(c is None for c in counts):
            break
        run = np.array([c is not None and c.number > 0 for c in counts])
        if run.any():
            chosen = np.flatnonzero(run)
            make_pass = group.step if group.prompt_kv is None else group.prompt_step  # the prompt cache's passes
            make_pass(chosen, hi, np.zeros(group.n, np.int64), tally, [counts[i] for i in chosen])  # type: ignore[misc]
            settled.report(group.x, group.prompt_width, group.kept, chosen)
    return group.tokens(), group.passes
