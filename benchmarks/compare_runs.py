"""Two bench runs side by side (e.g. before and after a change, measured on the same machine one after the other):
per row and setting, whether the forward passes, tokens processed and answers are the same, and the ratio of the
median seconds (after / before; run-to-run spread on a shared 2-core machine is 2x or more, so read the ratios as
"within noise" or not, never as a speedup).

    python benchmarks/compare_runs.py BEFORE/bench.json AFTER/bench.json [--labels before,after] > out.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load_rows(path: Path) -> dict[tuple[int, int, str], dict[str, Any]]:
    data = json.loads(path.read_text())
    return {(r["gen_length"], r["batch_size"], r["row"]): r for r in data["rows"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--labels", default="before,after")
    args = ap.parse_args()
    old_label, new_label = args.labels.split(",")
    before, after = load_rows(args.before), load_rows(args.after)
    common = sorted(set(before) & set(after))
    print(f"| gen | batch | row | passes ({old_label} / {new_label}) | tokens ({old_label} / {new_label}) | "
          f"same answers | {old_label} s | {new_label} s | {new_label} / {old_label} |")
    print("|---:|---:|---|---|---|---|---:|---:|---:|")
    ratios = []
    for key in common:
        b, a = before[key], after[key]
        same = (a["exact_match"], a["identical_to_full"]) == (b["exact_match"], b["identical_to_full"])
        ratio = a["seconds"] / b["seconds"]
        ratios.append(ratio)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {b['forward_passes']:,} / {a['forward_passes']:,} | "
              f"{b['tokens_processed']:,} / {a['tokens_processed']:,} | {'yes' if same else 'NO'} | "
              f"{b['seconds']:.3f} | {a['seconds']:.3f} | {ratio:.2f} |")
    print()
    passes = all(before[k]["forward_passes"] == after[k]["forward_passes"] for k in common)
    tokens = all(before[k]["tokens_processed"] == after[k]["tokens_processed"] for k in common)
    print(f"{len(common)} rows: passes {'all equal' if passes else 'DIFFER'}, tokens processed "
          f"{'all equal' if tokens else 'DIFFER'}; seconds {new_label} / {old_label}: median "
          f"{statistics.median(ratios):.2f}, range {min(ratios):.2f} to {max(ratios):.2f}.")


if __name__ == "__main__":
    main()
