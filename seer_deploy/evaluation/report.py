"""The eval's one table: per task and mode, the score, its paired difference from full length, the answers
identical to full length's, and what the answers cost; as text, markdown and JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seer_deploy.evaluation.modes import BASELINE, MODES
from seer_deploy.evaluation.paired import PairedDifference, paired_difference
from seer_deploy.evaluation.run import Cell

HEADERS = ("task", "mode", "metric", "docs", "score", "vs full [CI]", "identical", "tokens processed", "passes", "seconds",
           "kept / gen")
MEANING = (
    "score: the task's metric (the harness's own scoring) on the same documents in every mode; "
    "vs full [CI]: the mean per-document difference from full length with its paired {confidence:.0%} bootstrap "
    "interval (an interval containing 0: no measurable change); identical: answers equal to full length's, "
    "character for character; tokens processed and passes: the model's work (real tokens through it, forward passes); "
    "seconds: the service's generation time; kept / gen: Seer's mean kept response length of --gen-length."
)


@dataclass(frozen=True)
class ReportRow:
    cell: Cell
    difference: PairedDifference | None  # None for the baseline itself
    identical: float

    def to_dict(self) -> dict[str, Any]:
        c = self.cell
        return {"task": c.task, "mode": c.mode, "flags": MODES[c.mode].flags, "metric": c.metric, "score": c.value,
                "metrics": c.metrics, "vs_full": self.difference.to_dict() if self.difference else None,
                "identical_to_full": self.identical, "documents": len(c.scores), "tokens_processed": c.tokens_processed,
                "passes": c.passes, "seconds": round(c.seconds, 4), "mean_kept": c.mean_kept,
                "gen_length": c.gen_length, "scores": c.scores, "answers": c.answers}


def compare(cells: Sequence[Cell], confidence: float = 0.95) -> list[ReportRow]:
    """Each cell against its task's full-length cell, document by document."""
    base = {c.task: c for c in cells if c.mode == BASELINE}
    rows = []
    for cell in cells:
        full = base[cell.task]
        same = sum(a == b for a, b in zip(cell.answers, full.answers, strict=True)) / max(1, len(cell.answers))
        diff = None if cell.mode == BASELINE else paired_difference(cell.scores, full.scores, confidence)
        rows.append(ReportRow(cell, diff, same))
    return rows


def _cells(row: ReportRow) -> list[str]:
    c, d = row.cell, row.difference
    vs = "-" if d is None else f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
    kept = "-" if c.mean_kept is None else f"{c.mean_kept:.1f} / {c.gen_length}"
    return [c.task, c.mode, c.metric, str(len(c.scores)), f"{c.value:.4f}", vs, f"{row.identical:.0%}", str(c.tokens_processed),
            str(c.passes), f"{c.seconds:.2f}", kept]


def render_text(rows: Sequence[ReportRow]) -> str:
    """The table for a terminal: columns padded to their widest cell."""
    table = [list(HEADERS)] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in table)


def render_markdown(rows: Sequence[ReportRow], command: str, confidence: float = 0.95) -> str:
    """The table as markdown, under the command that produced it, with the modes' flags and what the columns mean."""
    lines = [f"Command: `{command}`", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    modes = dict.fromkeys(r.cell.mode for r in rows)
    lines += ["", "Modes: " + "; ".join(f"{m} = `{MODES[m].flags}`" for m in modes) + ".", "",
              MEANING.format(confidence=confidence)]
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[ReportRow], command: str, settings: dict[str, Any]) -> dict[str, Any]:
    return {"command": command, "settings": settings, "rows": [r.to_dict() for r in rows]}
