"""Before against after, cell by cell: the comparison both A/B benches print (profile_executorch --compare, which
switches the cost cuts in one process, and against_commit, which runs an earlier commit's code beside today's)."""

from __future__ import annotations

import statistics
from collections import defaultdict

# the stage totals compared, besides the whole cell; a backend without the stage has none to compare
STAGES = ("to-edge", "to-executorch")


def print_comparison(cells: list[dict]) -> None:
    """Per backend and shape mode: which cells kept their status and stage, and the seconds before and after.

    Each cell is a dict with "cell" (its id, model-backend-shape), "variant" ("before" or "after"), "status",
    "stage", "seconds" and "stages" (seconds by stage name)."""
    pairs = defaultdict(dict)
    for cell in cells:
        pairs[cell["cell"]][cell["variant"]] = cell
    groups = defaultdict(list)
    for cell_id, pair in pairs.items():
        if len(pair) == 2:
            _, backend, shape_mode = cell_id.rsplit("-", 2)
            groups[(backend, shape_mode)].append(pair)
    for (backend, shape_mode), group in sorted(groups.items()):
        kept = [pair for pair in group if _outcome(pair["before"]) == _outcome(pair["after"])]
        changed = [(pair["after"]["cell"], pair["before"]["status"], pair["after"]["status"])
                   for pair in group if pair not in kept]  # fmt: skip
        print(f"{backend} {shape_mode}: {len(group)} cells run both ways, {len(group) - len(changed)} kept status and"
              f" stage; changed: {changed}")  # fmt: skip
        measures = [(stage, lambda cell, stage=stage: cell["stages"].get(stage, 0.0)) for stage in STAGES]
        for what, seconds_of in [*measures, ("cell", lambda cell: cell["seconds"])]:
            before = sum(seconds_of(pair["before"]) for pair in group)
            after = sum(seconds_of(pair["after"]) for pair in group)
            ratios = [seconds_of(pair["after"]) / seconds_of(pair["before"])
                      for pair in group if seconds_of(pair["before"])]  # fmt: skip
            kept_before = sum(seconds_of(pair["before"]) for pair in kept)
            kept_ratio = sum(seconds_of(pair["after"]) for pair in kept) / kept_before if kept_before else None
            if before:  # a cell whose outcome changed did other work: the ratio is also given without it
                print(f"  {what}: before {before:.0f} s, after {after:.0f} s ({after / before:.2f}x;"
                      f" median cell {statistics.median(ratios):.2f}x over {len(ratios)}"
                      + (f"; {kept_ratio:.2f}x over the {len(kept)} that kept their outcome)" if changed and kept_ratio
                         else ")"))  # fmt: skip


def _outcome(cell: dict) -> tuple[str, str | None]:
    return cell["status"], cell["stage"]
