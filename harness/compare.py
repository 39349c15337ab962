"""A run against a baseline: every cell gets one change kind, and the kinds a nightly fails on set its exit code.

The cells compared are those of the run, those its plan expected (a cell planned but never run is ``missing``:
a lost shard, a killed worker) and, when its selection is complete, the baseline's cells of classes the selection
would take but transformers no longer has (``vanished``). Baseline cells outside the selection are not compared.

    regression    passed in the baseline, does not pass now
    new-failure   not in the baseline (a class added upstream, a new backend), does not pass
    missing       expected by the run's plan, no record
    stage-moved   still not passing, at a later or an earlier stage
    drift         still passing, its max |diff| grown tenfold or more
    fixed         did not pass in the baseline, passes now
    new-pass      not in the baseline, passes
    vanished      in the baseline, its class gone from transformers
    unchanged     the same verdict at the same stage

Without a baseline every cell present is new (``new-pass`` / ``new-failure``) and only ``missing`` fails a run
by default: there is nothing to be worse than.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from .models import in_selection
from .plan import SweepPlan, plan_of_run
from .records import CellRecord, parse_cell_id
from .store import RUN_FILE, RunStore, read_json

CHANGE_KINDS = ("regression", "new-failure", "missing", "stage-moved", "drift", "fixed", "new-pass", "vanished",
                "unchanged")  # fmt: skip
FAILING_KINDS = ("regression", "new-failure", "missing")  # the nightly's default --fail-on against a baseline
WORSE_KINDS = ("regression", "new-failure", "missing", "stage-moved", "drift")  # listed first on the Changes page
DRIFT_FACTOR = 10.0
DRIFT_FLOOR = 1e-7  # below this a difference is rounding: 0 to 5e-8 is no drift


@dataclass
class Change:
    cell_id: str
    model_class: str
    backend: str
    shape_mode: str
    kind: str
    status: str | None = None  # None: no record in this run
    stage: str | None = None
    baseline_status: str | None = None  # None: no record in the baseline
    baseline_stage: str | None = None
    max_abs_diff: float | None = None
    baseline_max_abs_diff: float | None = None
    error_signature: str | None = None
    model_type: str | None = None
    task: str | None = None
    finished_at: str | None = None
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def stage_order(records) -> list[str]:
    """Stage names in pipeline order, merged from every record's sequence (the longest first)."""
    order: list[str] = []
    for record in sorted(records, key=lambda r: -len(r.stages)):
        previous = None
        for stage in record.stages:
            if stage.name not in order:
                order.insert(order.index(previous) + 1 if previous in order else len(order), stage.name)
            previous = stage.name
    return order


def _verdict(record: CellRecord | None) -> str:
    if record is None:
        return "no record"
    return "pass" if record.status == "pass" else f"{record.status} at {record.stage}"


def diff(records: dict[str, CellRecord], baseline: dict[str, CellRecord] | None, plan: SweepPlan | None = None,
         expected: set[str] | None = None) -> list[Change]:  # fmt: skip
    """One Change per compared cell, in the order of CHANGE_KINDS, then by cell id.

    ``expected`` is the cells the run was to run (default: its plan's, or its records when it has no plan)."""
    if expected is None:
        expected = set(plan.cells()) if plan is not None else set(records)
    base = baseline or {}
    every = list(records.values()) + list(base.values())
    order = {name: index for index, name in enumerate(stage_order(every))}
    changes = []
    for cell in sorted(set(records) | expected):
        now, before = records.get(cell), base.get(cell)
        changes.append(_change(cell, now, before, baseline is not None, order))
    if baseline is not None and plan is not None and plan.complete:
        for cell, before in base.items():
            if cell in records or cell in expected:
                continue
            planned = before.backend in plan.backends and before.shape_mode in plan.shapes and before.dtype in plan.dtypes
            if planned and in_selection(
                before.model_class, before.model_type, before.tasks, plan.selection
            ):
                changes.append(_change(cell, None, before, True, order, vanished=True))
    rank = {kind: index for index, kind in enumerate(CHANGE_KINDS)}
    return sorted(changes, key=lambda change: (rank[change.kind], change.cell_id))


def _change(cell: str, now: CellRecord | None, before: CellRecord | None, has_baseline: bool, order: dict,
            vanished: bool = False) -> Change:  # fmt: skip
    source = now or before
    if source is not None:
        model, backend, shape = source.model_class, source.backend, source.shape_mode
    else:
        model, backend, shape, _dtype = parse_cell_id(cell)
    change = Change(cell, model, backend, shape, "unchanged")
    if source is not None:
        change.model_type, change.task = source.model_type, source.task
    if now is not None:
        change.status, change.stage, change.max_abs_diff = now.status, now.stage, now.max_abs_diff
        change.error_signature, change.finished_at = now.error_signature, now.finished_at
    if before is not None:
        change.baseline_status, change.baseline_stage = before.status, before.stage
        change.baseline_max_abs_diff = before.max_abs_diff
    passes, passed = now is not None and now.status == "pass", before is not None and before.status == "pass"
    if vanished:
        change.kind, change.detail = "vanished", f"{_verdict(before)} → the class is gone from transformers"
    elif now is None:
        change.kind = "missing"
        change.detail = f"{_verdict(before)} → no record: planned, never run" if has_baseline else "planned, never run"
    elif before is None:
        change.kind = "new-pass" if passes else "new-failure"
        change.detail = f"new → {_verdict(now)}"
    elif passed and not passes:
        change.kind, change.detail = "regression", f"pass → {_verdict(now)}"
    elif passes and not passed:
        change.kind, change.detail = "fixed", f"{_verdict(before)} → pass"
    elif not passes:
        if now.stage != before.stage:
            later = order.get(now.stage, -1) > order.get(before.stage, -1)
            change.kind = "stage-moved"
            change.detail = f"{_verdict(before)} → {_verdict(now)} ({'later' if later else 'earlier'})"
        else:
            change.detail = f"{_verdict(before)} → {_verdict(now)}"
    else:
        grown = _drift(before.max_abs_diff, now.max_abs_diff)
        if grown:
            change.kind = "drift"
            change.detail = f"pass, max |diff| {before.max_abs_diff:.2g} → {now.max_abs_diff:.2g} ({grown:.0f}x)"
        else:
            change.detail = "pass"
    return change


def _drift(before: float | None, now: float | None) -> float | None:
    """How many times the difference grew, when that is DRIFT_FACTOR or more; else None."""
    if before is None or now is None or now != now or now <= DRIFT_FLOOR:  # now != now: NaN
        return None
    ratio = now / max(before, DRIFT_FLOOR)
    return ratio if ratio >= DRIFT_FACTOR else None


def failing(changes: list[Change], kinds) -> list[Change]:
    kinds = set(kinds)
    return [change for change in changes if change.kind in kinds]


def default_fail_on(has_baseline: bool) -> tuple[str, ...]:
    return FAILING_KINDS if has_baseline else ("missing",)


def expected_cells(run_dir: Path, plan: SweepPlan | None) -> set[str] | None:
    """What a run folder was to run: its shard of its plan (``run.json`` names the shard, and what a pytest session
    selected of it), or None without a plan."""
    if plan is None:
        return None
    try:
        planned = read_json(Path(run_dir) / RUN_FILE).get("plan") or {}
    except ValueError:
        planned = {}
    if isinstance(planned.get("selected"), list):  # a pytest session that deselected some (-k, --lf)
        return set(planned["selected"])
    shard = planned.get("shard")
    return set(plan.cells(shard if isinstance(shard, int) else None))


def compare_runs(run: str | Path, baseline: str | Path | None = None):
    """The change of every cell of ``run`` against ``baseline``, as a DataFrame (one row per cell, ``kind`` column)."""
    import pandas

    plan = plan_of_run(Path(run))
    records = {record.cell_id: record for record in RunStore(run).records()}
    base = {record.cell_id: record for record in RunStore(baseline).records()} if baseline is not None else None
    changes = diff(records, base, plan, expected_cells(Path(run), plan))
    columns = list(Change.__dataclass_fields__)
    return pandas.DataFrame([change.as_dict() for change in changes], columns=columns)
