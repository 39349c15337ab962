"""What the dashboard shows, computed from run folders (cell records only: the reports never import exporters)."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness.records import SHAPE_MODES, SHARED_STAGES, CellRecord, error_signature
from harness.store import RunStore

from exporters.backends import BACKENDS

# Where a workaround for a failure at this stage naturally goes (the exporters' registries, or the harness tables).
WORKAROUND_PLACE = {
    "config": "tiny-config override (harness/tables.py TINY_OVERRIDES)",
    "build": "tiny-config override (harness/tables.py TINY_OVERRIDES), or a missing optional package",
    "eager": "input factory (harness/inputs.py) or tiny-config override",
    "registry": "EXPORT_SKIPS entry (registry/known_issues.toml)",
    "signature": "exporter bug: Dynamo stage 1 (exporter_dynamo.py)",
    "model-patches": "a @register_patch('dynamo') factory that fails to install",
    "pytree": "pytree branch in _flatten_to_context / _unflatten_from_context (exporter_dynamo.py)",
    "dynamic-shapes": "DynamoConfig.dynamic_shapes, or Dim.AUTO handling (exporter_dynamo.py stage 4)",
    "state-cleanup": "_STATEFUL_CACHE_ATTRS (exporter_dynamo.py stage 5)",
    "torch-export": "model patch @register_patch('dynamo', ...) (exporter_dynamo.py stage 2)",
    "torch-patches": "a @register_patch factory of this backend that fails to install",
    "fx-node-fixes": "FX node fix @register_fx_node_fix",
    "onnx-patches": "ONNX patch @register_patch('onnx', 'torch.onnx...') (exporter_onnx.py stage 2)",
    "decompositions": "FX node fix @register_fx_node_fix('onnx') run after decompositions (stage 2/3)",
    "onnx-translation": "ONNX translation _aten_* (exporter_onnx.py stage 4)",
    "optimize": "ONNX_DISABLE_OPTIMIZE entry with its onnxscript bug, or an IR fix",
    "ir-fixes": "ONNX IR fix _fix_ir_* (exporter_onnx.py stage 5)",
    "backend-preparation": "prepare_for_<backend> (exporter_executorch.py stage 1)",
    "executorch-patches": "ExecuTorch patch @register_patch('executorch', 'executorch...') (stage 3)",
    "fx-program-fixes": "FX program fix @register_fx_program_fix('executorch') (stage 4)",
    "to-edge": "torch patch or FX node/program fix for ExecuTorch (exporter_executorch.py stages 2-5)",
    "to-executorch": "ExecuTorch patch (exporter_executorch.py stage 3)",
    "dynamic-axes": "a model patch that keeps the axis symbolic (exporter_dynamo.py stage 2), or inputs that vary only axes the model allows",
    "load": "runtime: ONNX IR fix (onnx) or ExecuTorch FX fix (executorch)",
    "run": "runtime: ONNX IR fix _fix_ir_* (onnx) or ExecuTorch FX fix",
    "parity": "numerics: a torch patch or ONNX translation; a wider tolerance only with a recorded reason",
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
}


def category(record: CellRecord) -> str:
    if record.status == "fail" and record.stage == "parity":
        return "mismatch"
    return record.status


@dataclass
class RunView:
    directory: Path
    metadata: dict
    records: list[CellRecord]
    by_id: dict[str, CellRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, directory) -> RunView:
        store = RunStore(directory)
        try:
            metadata = store.metadata()
        except ValueError:
            metadata = {}
        records = store.records()
        for record in records:  # the bucketing rules of this version, also for records written by older ones
            if record.error_signature:
                record.error_signature = error_signature(record.stage, record.error_type, record.message)
        return cls(Path(directory), metadata, records, {record.cell_id: record for record in records})

    @property
    def columns(self) -> list[tuple[str, str]]:
        """(backend, shape) columns present in this run, in the fixed order."""
        present = {(r.backend, r.shape_mode) for r in self.records}
        options = self.metadata.get("options", {})
        present |= {(b, s) for b in options.get("backends", []) for s in options.get("shapes", [])}
        return [(b, s) for b in BACKENDS for s in SHAPE_MODES if (b, s) in present]

    @property
    def classes(self) -> list[dict]:
        """One row per class: name, model type, tasks, and its cells by column key."""
        rows: dict[str, dict] = {}
        for record in self.records:
            row = rows.setdefault(
                record.model_class,
                {"name": record.model_class, "model_type": record.model_type, "task": record.task,
                 "tasks": record.tasks, "cells": {}},
            )  # fmt: skip
            row["cells"][f"{record.backend}-{record.shape_mode}"] = record
        return sorted(rows.values(), key=lambda row: row["name"])

    def duration(self) -> float | None:
        from datetime import datetime

        try:
            start = datetime.fromisoformat(self.metadata["started_at"])
            end = datetime.fromisoformat(self.metadata["finished_at"])
        except (KeyError, TypeError, ValueError):
            return None
        return (end - start).total_seconds()


def _percent(passed: int, total: int) -> float:
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
            "percent": _percent(passed, len(first)), "counts": Counter({"pass": passed}) + failed}  # fmt: skip


def tiles(view: RunView) -> list[dict]:
    eager = eager_tile(view)
    result = [eager] if eager else []
    for backend, shape in view.columns:
        cells = [r for r in view.records if r.backend == backend and r.shape_mode == shape]
        passed = sum(r.status == "pass" for r in cells)
        result.append(
            {"backend": backend, "shape": shape, "passed": passed, "total": len(cells),
             "percent": _percent(passed, len(cells)),
             "counts": Counter(category(r) for r in cells)}
        )  # fmt: skip
    return result


def stage_order(records: list[CellRecord]) -> list[str]:
    """Stage names in pipeline order, merged from every record's sequence."""
    order: list[str] = []
    for record in sorted(records, key=lambda r: -len(r.stages)):
        previous = None
        for stage in record.stages:
            if stage.name not in order:
                order.insert(order.index(previous) + 1 if previous in order else len(order), stage.name)
            previous = stage.name
    return order


def funnel(view: RunView) -> dict[str, list[dict]]:
    """Per backend: for each stage, how many cells reached it and how many got past it."""
    result = {}
    for backend in BACKENDS:
        records = [r for r in view.records if r.backend == backend]
        if not records:
            continue
        rows = []
        for name in stage_order(records):
            reached = sum(any(s.name == name for s in r.stages) for r in records)
            passed = sum(any(s.name == name and s.status == "pass" for s in r.stages) for r in records)
            rows.append({"stage": name, "reached": reached, "passed": passed, "total": len(records)})
        result[backend] = rows
    return result


def changes(view: RunView, baseline: RunView | None) -> dict[str, list[dict]]:
    """Regressions (passed in the baseline, not now) and new passes, against another run."""
    regressions, new_passes = [], []
    if baseline is None:
        return {"regressions": regressions, "new_passes": new_passes}
    for record in view.records:
        before = baseline.by_id.get(record.cell_id)
        if before is None:
            continue
        row = {"cell": record.cell_id, "before": f"{before.status} at {before.stage}",
               "now": f"{record.status} at {record.stage}", "record": record}  # fmt: skip
        if before.status == "pass" and record.status != "pass":
            regressions.append(row)
        elif before.status != "pass" and record.status == "pass":
            new_passes.append(row)
    return {"regressions": regressions, "new_passes": new_passes}


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
    for path in [stale_path, view.directory / "stale.json"]:
        if path and Path(path).is_file():
            try:
                return json.loads(Path(path).read_text())
            except json.JSONDecodeError:
                return None
    return None


def history(runs_dir: Path | None, current: RunView) -> dict:
    """Pass rate per backend across the runs in ``runs_dir`` (and this one), and the cells whose status flipped."""
    runs: list[RunView] = []
    if runs_dir is not None and Path(runs_dir).is_dir():
        for child in sorted(Path(runs_dir).iterdir()):
            if (child / "run.json").is_file() and child.resolve() != current.directory.resolve():
                try:
                    runs.append(RunView.load(child))
                except ValueError:
                    continue  # a broken old run does not stop the report
    runs.append(current)
    runs.sort(key=lambda run: run.metadata.get("started_at") or "")
    series = {backend: [] for backend in BACKENDS}
    labels = []
    for run in runs:
        labels.append((run.metadata.get("started_at") or run.directory.name)[:16].replace("T", " "))
        for backend in BACKENDS:
            cells = [r for r in run.records if r.backend == backend]
            series[backend].append(100.0 * sum(r.status == "pass" for r in cells) / len(cells) if cells else None)
    flips = []
    if len(runs) > 1:
        ids = sorted({cell for run in runs for cell in run.by_id})
        for cell in ids:
            statuses = [run.by_id[cell].status if cell in run.by_id else None for run in runs]
            seen = [s for s in statuses if s is not None]
            if len(set(seen)) > 1:
                flips.append({"cell": cell, "statuses": statuses})
    return {"labels": labels, "series": {k: v for k, v in series.items() if any(x is not None for x in v)}, "flips": flips}
