"""What the dashboard shows, computed from run folders: cell records only (the reports import no exporter, only the
backends' names, which import nothing)."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.compare import CHANGE_KINDS, diff, expected_cells, stage_order
from harness.ledger import ledger_rows, owner, read_listing
from harness.plan import PlanError, SweepPlan, plan_of_run
from harness.records import DTYPES, SHAPE_MODES, SHARED_STAGES, CellRecord, column_of, error_signature, parse_cell_id
from harness.store import RUN_FILE, CorruptRecordError, RunStore, read_json

from exporters.backends import BACKENDS

# Where a workaround for a failure at this stage naturally goes (the exporters' registries, or the harness tables).
WORKAROUND_PLACE = {
    "config": "tiny-config override (harness/tables.py TINY_OVERRIDES)",
    "build": "tiny-config override (harness/tables.py TINY_OVERRIDES), or a missing optional package",
    "eager": "input factory (harness/inputs.py) or tiny-config override",
    "registry": "EXPORT_SKIPS entry (registry/known_issues.toml)",
    "signature": "exporter bug: Dynamo stage 1 (exporters/dynamo/exporter.py)",
    "model-patches": "a @register_patch('dynamo') factory that fails to install",
    "pytree": "pytree branch in _flatten_to_context / _unflatten_from_context (exporters/pytree.py)",
    "dynamic-shapes": "DynamoConfig.dynamic_shapes, or Dim.AUTO handling (exporters/dynamo/exporter.py stage 4)",
    "state-cleanup": "_STATEFUL_CACHE_ATTRS (exporters/dynamo/exporter.py stage 5)",
    "torch-export": "model patch @register_patch('dynamo', ...) (exporters/dynamo/patches/, by family)",
    "torch-patches": "a @register_patch factory of this backend that fails to install",
    "fx-node-fixes": "FX node fix @register_fx_node_fix",
    "onnx-patches": "ONNX patch @register_patch('onnx', 'torch.onnx...') (exporters/onnx/workarounds.py stage 2)",
    "decompositions": "FX node fix @register_fx_node_fix('onnx') run after decompositions (stage 2/3)",
    "onnx-translation": "ONNX translation _aten_* (exporters/onnx/workarounds.py stage 4)",
    "optimize": "ONNX_DISABLE_OPTIMIZE entry with its onnxscript bug, or an IR fix",
    "ir-fixes": "ONNX IR fix _fix_ir_* (exporters/onnx/workarounds.py stage 5)",
    "backend-preparation": "prepare_for_<backend> (exporters/executorch/backends.py stage 1)",
    "executorch-patches": "ExecuTorch patch @register_patch('executorch', 'executorch...') (stage 3)",
    "fx-program-fixes": "FX program fix @register_fx_program_fix('executorch') (stage 4)",
    "to-edge": "torch patch or FX node/program fix for ExecuTorch (exporters/executorch/: torch_patches, program_fixes, node_fixes)",
    "to-executorch": "ExecuTorch patch (exporters/executorch/lowering_patches.py stage 3)",
    "dynamic-axes": "a model patch that keeps the axis symbolic (exporters/dynamo/patches/), or inputs that vary only axes the model allows",
    "load": "runtime: ONNX IR fix (onnx) or ExecuTorch FX fix (executorch)",
    "run": "runtime: ONNX IR fix _fix_ir_* (onnx) or ExecuTorch FX fix",
    "parity": "numerics: a torch patch or ONNX translation; a wider tolerance only with a recorded reason",
    "shared-state": "the exporter or reference that wrote into the class's inputs or model: make it work on a copy",
}

CATEGORY_LABELS = {
    "pass": "pass",
    "mismatch": "parity mismatch",
    "fail": "failed",
    "skip": "skipped by registry",
    "timeout": "timeout",
    "crash": "crash",
    "oom": "out of memory",
    "unavailable": "unavailable",
    "missing": "missing (planned, not run)",
}
CHANGE_LABELS = {
    "regression": "regressions: passed in the baseline, not now",
    "new-failure": "new failures: not in the baseline, not passing",
    "missing": "missing: planned, never run (a lost shard, a killed worker)",
    "stage-moved": "stage moved: still failing, at another stage",
    "drift": "drift: still passing, max |diff| grown tenfold or more",
    "fixed": "fixed: did not pass in the baseline, pass now",
    "new-pass": "new passes: not in the baseline, passing",
    "vanished": "vanished: the class is gone from transformers",
    "unchanged": "unchanged",
}
# What a maintainer asks first ("how are the VLMs doing?"): the inputs a class is fed say its modality.
MODALITIES = ("text", "vision", "audio", "multimodal", "other")


def category(record: CellRecord) -> str:
    if record.status == "fail" and record.stage == "parity":
        return "mismatch"
    return record.status


def modality(record: CellRecord) -> str:
    inputs = record.input_set or ""
    if "+" in inputs:
        return "multimodal"
    return {"text": "text", "image": "vision", "video": "vision", "audio": "audio"}.get(inputs, "other")


@dataclass
class RunView:
    directory: Path
    metadata: dict
    records: list[CellRecord]
    by_id: dict[str, CellRecord] = field(default_factory=dict)
    plan: SweepPlan | None = None
    missing: list[str] = field(default_factory=list)  # planned cells without a record
    corrupt: list[str] = field(default_factory=list)  # files that could not be read, each named: the rest renders

    @classmethod
    def load(cls, directory) -> RunView:
        store = RunStore(directory)
        corrupt: list[str] = []
        try:
            metadata = store.metadata()
        except CorruptRecordError as error:
            metadata = {}
            if (store.directory / RUN_FILE).exists():
                corrupt.append(str(error))
        records = store.records(errors=corrupt)
        for record in records:  # the bucketing rules of this version, also for records written by older ones
            if record.error_signature:
                record.error_signature = error_signature(record.stage, record.error_type, record.message)
        try:
            plan = plan_of_run(store.directory)
        except (PlanError, CorruptRecordError) as error:
            plan = None
            corrupt.append(str(error))
        by_id = {record.cell_id: record for record in records}
        expected = expected_cells(store.directory, plan) or set()
        return cls(Path(directory), metadata, records, by_id, plan, sorted(expected - set(by_id)), corrupt)

    @property
    def label(self) -> str:
        """How a run is named beside another: its start date, or its folder."""
        return (self.metadata.get("started_at") or "")[:10] or self.directory.name

    @property
    def columns(self) -> list[tuple[str, str]]:
        """(backend, mode) columns present in this run, in the fixed order; a mode is a shape mode, with its dtype
        when not float32 (``static-bfloat16``)."""
        present = {(r.backend, r.mode) for r in self.records}
        options = self.metadata.get("options", {}) if isinstance(self.metadata.get("options"), dict) else {}
        backends, shapes = options.get("backends") or [], options.get("shapes") or []
        dtypes = options.get("dtypes") or list(DTYPES[:1])
        if self.plan is not None:
            backends, shapes, dtypes = self.plan.backends, self.plan.shapes, self.plan.dtypes
        present |= {(b, column_of(s, d)) for b in backends for s in shapes for d in dtypes
                    if isinstance(b, str) and isinstance(s, str) and d in DTYPES}  # fmt: skip
        modes = [column_of(s, d) for s in SHAPE_MODES for d in DTYPES]
        return [(b, m) for b in BACKENDS for m in modes if (b, m) in present]

    def missing_in(self, backend: str, shape: str) -> list[str]:
        return [cell for cell in self.missing if cell.endswith(f"-{backend}-{shape}")]

    @property
    def classes(self) -> list[dict]:
        """One row per class: name, model type, tasks, and its cells by column key (missing ones named)."""
        rows: dict[str, dict] = {}
        for record in self.records:
            row = rows.setdefault(
                record.model_class,
                {"name": record.model_class, "model_type": record.model_type, "task": record.task,
                 "tasks": record.tasks, "cells": {}, "missing": set(), "failing": 0},
            )  # fmt: skip
            row["cells"][f"{record.backend}-{record.mode}"] = record
            row["failing"] += record.status not in ("pass", "skip", "unavailable")
        for cell in self.missing:
            model, backend, shape, dtype = parse_cell_id(cell)
            row = rows.setdefault(model, {"name": model, "model_type": "", "task": "", "tasks": [], "cells": {},
                                          "missing": set(), "failing": 0})  # fmt: skip
            row["missing"].add(f"{backend}-{column_of(shape, dtype)}")
            row["failing"] += 1
        # failures first: what a maintainer opens the matrix for
        return sorted(rows.values(), key=lambda row: (row["failing"] == 0, row["name"]))

    def duration(self) -> float | None:
        from datetime import datetime

        try:
            start = datetime.fromisoformat(self.metadata["started_at"])
            end = datetime.fromisoformat(self.metadata["finished_at"])
        except (KeyError, TypeError, ValueError):
            return None
        return (end - start).total_seconds()


def percent(passed: int, total: int) -> float:
    return math.floor(1000.0 * passed / total) / 10 if total else 0.0  # 99.95% is not 100.0%


def eager_tile(view: RunView) -> dict | None:
    """Per class (not per cell): did its tiny model build and run in eager? A class counts once, by its first cell
    that was not skipped; cells failing a shared stage fail it for every backend alike."""
    first: dict[str, CellRecord] = {}
    for record in view.records:
        if record.status not in ("skip", "unavailable"):
            first.setdefault(record.model_class, record)
    if not first:
        return None
    failed = Counter(category(r) for r in first.values() if r.status != "pass" and r.stage in SHARED_STAGES)
    passed = len(first) - sum(failed.values())
    return {"backend": "eager", "shape": "classes", "passed": passed, "total": len(first),
            "percent": percent(passed, len(first)), "counts": Counter({"pass": passed}) + failed}  # fmt: skip


def tiles(view: RunView, baseline: RunView | None = None) -> list[dict]:
    """Pass rate per column; planned cells without a record count as not passing. Against a baseline, each tile
    carries its change in points."""
    eager = eager_tile(view)
    result = [eager] if eager else []
    for backend, shape in view.columns:
        cells = [r for r in view.records if r.backend == backend and r.mode == shape]
        missing = len(view.missing_in(backend, shape))
        passed = sum(r.status == "pass" for r in cells)
        counts = Counter(category(r) for r in cells)
        if missing:
            counts["missing"] = missing
        result.append({"backend": backend, "shape": shape, "passed": passed, "total": len(cells) + missing,
                       "percent": percent(passed, len(cells) + missing), "counts": counts})  # fmt: skip
    if baseline is not None:
        before = {(tile["backend"], tile["shape"]): tile for tile in tiles(baseline)}
        for tile in result:
            old = before.get((tile["backend"], tile["shape"]))
            if old is not None and old["total"]:
                tile["delta"] = round(tile["percent"] - old["percent"], 1)
                tile["baseline_label"] = baseline.label
    return result


def dtype_shares(view: RunView) -> list[dict]:
    """Each half-precision column against float32: of the classes that pass a backend and shape mode in float32,
    how many pass it in the other dtype, and how many the backend's runtime cannot run in it (``unavailable``), so
    that the share of what the runtime can run is told apart from the share of all."""
    passing = {(r.backend, r.shape_mode, r.model_class) for r in view.records if r.dtype == DTYPES[0] and r.status == "pass"}
    rows = []
    for backend, mode in view.columns:
        cells = [r for r in view.records if r.backend == backend and r.mode == mode and r.dtype != DTYPES[0]
                 and (r.backend, r.shape_mode, r.model_class) in passing]  # fmt: skip
        if not cells:
            continue
        counts = Counter(category(r) for r in cells)
        passed, unavailable = counts["pass"], counts.get("unavailable", 0)
        runnable = len(cells) - unavailable
        rows.append({"backend": backend, "shape": cells[0].shape_mode, "dtype": cells[0].dtype, "base": len(cells),
                     "passed": passed, "unavailable": unavailable, "percent": percent(passed, len(cells)),
                     "percent_runnable": percent(passed, runnable) if runnable else None, "counts": counts})  # fmt: skip
    return rows


# A cell that needs more is too large for a hosted CI runner's share (issue 57): the cost table counts them.
MEMORY_CEILING_MB = 4096


def cost(view: RunView) -> dict:
    """What the run cost, per backend and shape mode, from the cells it ran (a reused cell cost this run nothing):
    cell-hours, the median cell, the three stages that took the most, the largest worker memory, and every cell
    whose worker went above MEMORY_CEILING_MB. A cell's memory is its class worker's peak up to its end."""
    rows = []
    for backend, mode in view.columns:
        ran = [r for r in view.records if r.backend == backend and r.mode == mode and not r.reused and r.seconds]
        if not ran:
            continue
        by_stage: Counter = Counter()
        for record in ran:
            for stage in record.stages:
                by_stage[stage.name] += stage.seconds
        peaks = [r.peak_rss_mb for r in ran if r.peak_rss_mb is not None]
        rows.append({"backend": backend, "shape": mode, "cells": len(ran), "hours": sum(r.seconds for r in ran) / 3600,
                     "median_seconds": statistics.median(r.seconds for r in ran),
                     "stages": [(name, seconds / 3600) for name, seconds in by_stage.most_common(3)],
                     "peak_mb": max(peaks) if peaks else None})  # fmt: skip
    above = sorted(((r.peak_rss_mb, r.cell_id) for r in view.records
                    if not r.reused and (r.peak_rss_mb or 0) > MEMORY_CEILING_MB), reverse=True)  # fmt: skip
    return {"rows": rows, "hours": sum(row["hours"] for row in rows), "ceiling_mb": MEMORY_CEILING_MB,
            "above": [{"cell_id": cell_id, "peak_mb": peak} for peak, cell_id in above]}  # fmt: skip


def breakdown(view: RunView) -> list[dict]:
    """Pass rates by modality, then by task, per column: ``[{"group", "value", "cells": {column: (passed, total)}}]``."""
    rows = []
    for group, key in (("modality", lambda r: [modality(r)]), ("task", lambda r: r.tasks or [r.task])):
        table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for record in view.records:
            for value in key(record):
                tally = table[value][f"{record.backend}-{record.mode}"]
                tally[0] += record.status == "pass"
                tally[1] += 1
        order = MODALITIES if group == "modality" else sorted(table, key=lambda v: (-sum(t[1] for t in table[v].values()), v))
        for value in order:
            if value in table:
                rows.append({"group": group, "value": value, "cells": {k: tuple(v) for k, v in table[value].items()}})
    return rows


def funnel(view: RunView) -> dict[str, list[dict]]:
    """Per backend: for each stage, how many cells reached it, got past it, and were lost there. The bars are
    scaled to the largest loss, so a loss of 3 % at one stage shows as plainly as one of 30 %."""
    result = {}
    for backend in BACKENDS:
        records = [r for r in view.records if r.backend == backend]
        missing = sum(parse_cell_id(cell)[1] == backend for cell in view.missing)
        if not records and not missing:
            continue
        rows = []
        for name in stage_order(records):
            reached = sum(any(s.name == name for s in r.stages) for r in records)
            passed = sum(any(s.name == name and s.status == "pass" for s in r.stages) for r in records)
            rows.append({"stage": name, "reached": reached, "passed": passed, "lost": reached - passed,
                         "total": len(records) + missing})  # fmt: skip
        if missing:
            rows.insert(0, {"stage": "(never run)", "reached": len(records) + missing, "passed": len(records),
                            "lost": missing, "total": len(records) + missing})  # fmt: skip
        largest = max((row["lost"] for row in rows), default=0) or 1
        for row in rows:
            row["scaled"] = round(100.0 * row["lost"] / largest, 1)
        result[backend] = rows
    return result


def changes(view: RunView, baseline: RunView | None) -> dict:
    """Every cell's change against the baseline, by kind (``harness.compare``): empty without a baseline."""
    if baseline is None:
        return {"baseline": None, "kinds": {}, "counts": {}}
    found = diff(view.by_id, baseline.by_id, view.plan, set(view.by_id) | set(view.missing))
    kinds = {kind: [change for change in found if change.kind == kind] for kind in CHANGE_KINDS}
    return {"baseline": baseline, "kinds": kinds, "counts": {kind: len(items) for kind, items in kinds.items()}}


def buckets(view: RunView) -> list[dict]:
    """Failures grouped by stage and normalized error signature, largest first."""
    groups: dict[tuple, list[CellRecord]] = defaultdict(list)
    for record in view.records:
        if record.status in ("pass", "skip"):
            continue
        groups[(record.stage, record.error_signature or f"{record.stage}: {record.status}")].append(record)
    result = []
    for (stage, signature), records in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        example = next((r for r in records if r.traceback), records[0])
        result.append(
            {"stage": stage, "signature": signature, "count": len(records), "records": records,
             "classes": sorted({r.model_class for r in records}),
             "backends": Counter(r.backend for r in records), "example": example,
             "place": WORKAROUND_PLACE.get(stage, "see the cell pages"), "status": Counter(r.status for r in records)}
        )  # fmt: skip
    return result


def parity(view: RunView) -> dict[str, dict]:
    """Per backend: histogram of log10(max abs diff) for passing and mismatching cells, and the worst offenders."""
    result = {}
    edges = list(range(-10, 3))  # 1e-10 ... 1e2, plus an underflow bin for exact zeros
    for backend in BACKENDS:
        records = [r for r in view.records if r.backend == backend and r.max_abs_diff is not None]
        if not records:
            continue
        bins = {"pass": [0] * (len(edges) + 1), "mismatch": [0] * (len(edges) + 1)}
        for record in records:
            value = record.max_abs_diff
            if value <= 0 or math.isnan(value):
                index = 0
            elif math.isinf(value):  # an overflow in the exported program: the top bin
                index = len(edges)
            else:
                index = min(len(edges), max(1, math.floor(math.log10(value)) + 11))
            bins["pass" if record.status == "pass" else "mismatch"][index] += 1
        worst = sorted(records, key=lambda r: -(r.max_abs_diff if not math.isnan(r.max_abs_diff) else math.inf))[:15]
        result[backend] = {"bins": bins, "labels": ["0"] + [f"1e{e}" for e in edges], "worst": worst, "count": len(records)}
    return result


def registry_rows(view: RunView, stale: dict | None) -> list[dict]:
    """Every registry entry with its reason, link and stale-check verdict."""
    from registry import Registry, RegistryError

    path = view.metadata.get("options", {}).get("registry")
    try:
        registry = Registry.load(path if path and Path(path).is_file() else None)
    except RegistryError as error:
        return [{"error": str(error)}]
    verdicts = {}
    for finding in (stale or {}).get("entries", []):
        verdicts[(finding["list"], finding["model"], finding["scope"])] = finding
    rows = []
    for entry in registry.entries:
        finding = verdicts.get((entry.list, entry.model, entry.scope), {})
        affected = [r for r in view.records if r.registry and r.registry.get("model") == entry.model
                    and r.registry.get("scope") == entry.scope and r.registry.get("list") == entry.list]  # fmt: skip
        rows.append({"entry": entry, "verdict": finding.get("verdict", "unknown (no stale check)"),
                     "evidence": finding.get("evidence", []), "cells": affected})  # fmt: skip
    return rows


def load_stale(view: RunView, stale_path: Path | None) -> dict | None:
    """The stale check's findings: from ``--stale`` (a file that is not one is an error), else the run's own
    ``stale.json`` (a broken one is listed with the run's unreadable files, and the rest renders)."""
    if stale_path is not None:
        return _stale_file(Path(stale_path))
    path = view.directory / "stale.json"
    if not path.is_file():
        return None
    try:
        return _stale_file(path)
    except ValueError as error:
        view.corrupt.append(str(error))
        return None


def _stale_file(path: Path) -> dict:
    data = read_json(path)  # names the file and line when it is not JSON
    entries = data.get("entries")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(key), str) for key in ("list", "model", "scope", "verdict"))
        for e in entries
    ):
        raise CorruptRecordError(f"{path}: not a stale check: 'entries' must be a list of findings, each with list, "
                                 "model, scope and verdict")  # fmt: skip
    for entry in entries:
        if not isinstance(entry.get("evidence", []), list):
            raise CorruptRecordError(f"{path}: finding {entry['model']}: 'evidence' must be a list")
    return data


# ── Workarounds: the ledger ──────────────────────────────────────────────────


def workaround_ledger(view: RunView, listing: list[dict] | None, stale: dict | None) -> dict:
    """Every workaround of the run's code, the cells it fired on and which failed, and the stale check's verdict."""
    if listing is None:
        try:
            listing = read_listing(view.directory)
        except CorruptRecordError as error:
            view.corrupt.append(str(error))
    if listing is None:
        return {"rows": [], "known": False, "owner": lambda backend, name: backend}
    verdicts = {(f.get("backend"), f.get("name")): f for f in (stale or {}).get("workarounds", []) if isinstance(f, dict)}
    rows = ledger_rows(listing, view.records)
    for row in rows:
        row["finding"] = verdicts.get((row["backend"], row["name"]))
    fired = sum(bool(row["fired"]) for row in rows)
    listed = {(row["backend"], row["name"]) for row in rows}
    return {"rows": rows, "known": True, "linked": sum(bool(row["upstream"]) for row in rows), "fired": fired,
            "checked_at": (stale or {}).get("checked_at") if verdicts else None,
            "owner": lambda backend, name: owner(listed, backend, name)}  # fmt: skip


# ── History: the nights before this one ──────────────────────────────────────

NIGHTS_FILE = "nights.json"  # written beside the dashboard: the night summaries History was drawn from
NIGHTS_KEPT = 30


def night_summary(view: RunView) -> dict:
    """What History needs of a run, small enough to keep 30 of: its pass rates, and the cells not passing."""
    rates = {}
    for backend in BACKENDS:
        cells = [r for r in view.records if r.backend == backend]
        missing = sum(parse_cell_id(cell)[1] == backend for cell in view.missing)
        if cells or missing:
            rates[backend] = round(100.0 * sum(r.status == "pass" for r in cells) / (len(cells) + missing), 2)
    not_passing = {r.cell_id: r.status for r in view.records if r.status != "pass"}
    not_passing.update({cell: "missing" for cell in view.missing})
    return {"started_at": view.metadata.get("started_at") or "", "label": view.label,
            "git_sha": view.metadata.get("git_sha"), "versions": view.metadata.get("versions", {}),
            "rates": rates, "cells": len(view.records) + len(view.missing), "not_passing": not_passing}  # fmt: skip


def _earlier_nights(source: Path | None, current: RunView) -> list[dict]:
    """Night summaries from ``source``: a folder of run folders, or a nights.json written by an earlier report."""
    if source is None:
        return []
    source = Path(source)
    if source.is_file():
        data = read_json(source) if source.suffix == ".json" else {}
        nights = data.get("nights")
        if not isinstance(nights, list) or not all(isinstance(n, dict) and isinstance(n.get("rates"), dict) for n in nights):
            raise CorruptRecordError(f"{source}: not a {NIGHTS_FILE} (a 'nights' list of night summaries)")
        return [n for n in nights if n.get("started_at") != current.metadata.get("started_at")]
    nights = []
    for child in sorted(source.iterdir()):
        if (child / RUN_FILE).is_file() and child.resolve() != current.directory.resolve():
            view = RunView.load(child)
            if view.corrupt:  # an old run that cannot be read whole is left out, and said so
                current.corrupt.extend(f"history: {problem}" for problem in view.corrupt)
            nights.append(night_summary(view))
    return nights


def history(source: Path | None, current: RunView) -> dict:
    """Pass rate per backend across the earlier nights (and this one), and the cells whose status flipped."""
    nights = sorted([*_earlier_nights(source, current), night_summary(current)], key=lambda n: n["started_at"])
    nights = nights[-NIGHTS_KEPT:]
    series = {backend: [n["rates"].get(backend) for n in nights] for backend in BACKENDS}
    series = {backend: values for backend, values in series.items() if any(v is not None for v in values)}
    flips = []
    if len(nights) > 1:
        for cell in sorted({cell for night in nights for cell in night["not_passing"]}):
            statuses = [night["not_passing"].get(cell, "pass") for night in nights]
            if len(set(statuses)) > 1:
                flips.append({"cell": cell, "statuses": statuses})
    values = [v for vs in series.values() for v in vs if v is not None]
    low, high = (min(values), max(values)) if values else (0.0, 100.0)
    pad = max(0.5, (high - low) * 0.15)  # the axis spans the data: a 0.3-point drop must be visible
    axis = (max(0.0, math.floor(low - pad)), min(100.0, math.ceil(high + pad)))
    if axis[0] == axis[1]:
        axis = (max(0.0, axis[0] - 1), min(100.0, axis[1] + 1))
    labels = [(n["started_at"] or n["label"])[:16].replace("T", " ") for n in nights]
    return {"labels": labels, "series": series, "flips": flips, "nights": nights, "axis": axis}
