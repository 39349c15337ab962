"""A run against its baseline: every kind of change is found, named, and sets the exit code of run / merge / report.

The runs here are real run folders of cell records (as a sweep writes them), with a plan; the commands run for real
in subprocesses. What a record says is planted, so each kind of change appears exactly once.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import compare_runs
from harness.plan import SweepPlan
from harness.records import CellRecord, StageRecord
from harness.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["config", "build", "eager", "torch-export", "decompositions", "onnx-translation", "load", "run", "parity"]


def record(model, status="pass", stage="parity", max_abs=1e-6, backend="onnx", shape="static"):
    cell = CellRecord(model, "synthetic", "base", backend, shape, tasks=["base"])
    for name in STAGES[: STAGES.index(stage) + 1]:
        failed = name == stage and status != "pass"
        cell.stages.append(StageRecord(name, status if failed else "pass", 0.5, "RuntimeError" if failed else None,
                                       f"boom at {name}" if failed else None))  # fmt: skip
    if status == "pass":
        cell.max_abs_diff = max_abs
    cell.finished_at = "2026-12-06T00:00:00+00:00"
    return cell.finish()


def plan_of(models, shards=1, selection=None):
    classes = {m: {"shard": 1 + i % shards, "cells": [f"{m}-onnx-static"]} for i, m in enumerate(models)}
    return SweepPlan(selection or {"models": "Model*"}, ["onnx"], ["static"], shards, classes)


def write_run(directory, records, plan=None, shard=None):
    store = RunStore(directory)
    store.create({"models": "Model*", "backends": ["onnx"], "shapes": ["static"]}, plan=plan, shard=shard)
    for cell in records:
        store.write(cell)
    store.finish()
    return directory


def export_sweep(*args):
    return subprocess.run([sys.executable, "-m", "commands", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.fixture
def nights(tmp_path):
    """Last night and tonight: one cell of every kind of change."""
    baseline = write_run(tmp_path / "baseline", [
        record("ModelSame"),
        record("ModelRegressed"),
        record("ModelFixed", "fail", "torch-export"),
        record("ModelMoved", "fail", "torch-export"),
        record("ModelDrifted", max_abs=1e-7 * 3),
        record("ModelGone"),  # its class left transformers: tonight's plan does not have it
        record("ModelLost"),  # in tonight's plan, but its shard never came back
    ])  # fmt: skip
    tonight = ["ModelSame", "ModelRegressed", "ModelFixed", "ModelMoved", "ModelDrifted", "ModelNewBroken",
               "ModelNewGood", "ModelLost"]  # fmt: skip
    run = write_run(tmp_path / "tonight", [
        record("ModelSame"),
        record("ModelRegressed", "fail", "onnx-translation"),
        record("ModelFixed"),
        record("ModelMoved", "fail", "parity"),
        record("ModelDrifted", max_abs=5e-5),
        record("ModelNewBroken", "fail", "decompositions"),  # a class added upstream that does not export
        record("ModelNewGood"),
    ], plan=plan_of(tonight))  # fmt: skip
    return run, baseline


def test_every_cell_gets_its_change_kind(nights):
    run, baseline = nights
    frame = compare_runs(run, baseline)
    kinds = dict(zip(frame.model_class, frame.kind))
    assert kinds == {
        "ModelSame": "unchanged", "ModelRegressed": "regression", "ModelFixed": "fixed", "ModelMoved": "stage-moved",
        "ModelDrifted": "drift", "ModelNewBroken": "new-failure", "ModelNewGood": "new-pass", "ModelGone": "vanished",
        "ModelLost": "missing",
    }  # fmt: skip
    moved = frame[frame.kind == "stage-moved"].iloc[0]
    assert (moved.baseline_stage, moved.stage) == ("torch-export", "parity") and "later" in moved.detail
    assert "167x" in frame[frame.kind == "drift"].iloc[0].detail


def test_a_narrower_selection_does_not_call_the_rest_vanished(tmp_path, nights):
    _run, baseline = nights
    sample = write_run(tmp_path / "sample", [record("ModelSame")],
                       plan=plan_of(["ModelSame"], selection={"models": "Model*", "sample": 1}))  # fmt: skip
    assert list(compare_runs(sample, baseline).kind) == ["unchanged"]


def test_report_exits_1_on_a_failing_kind_and_names_the_cells(nights):
    run, baseline = nights
    result = export_sweep("report", run, "--baseline", baseline)
    assert result.returncode == 1, result.stderr
    for cell in ("ModelRegressed-onnx-static", "ModelNewBroken-onnx-static", "ModelLost-onnx-static"):
        assert cell in result.stderr
    assert "ModelMoved-onnx-static" not in result.stderr.split("(exit 1)")[1]  # still failing: not news
    changes = (run / "site" / "changes.html").read_text()
    for kind in ("regression", "new-failure", "missing", "stage-moved", "drift", "fixed", "new-pass", "vanished"):
        assert f'id="{kind}"' in changes

    drift_only = export_sweep("report", run, "--baseline", baseline, "--fail-on", "drift")
    assert drift_only.returncode == 1 and "ModelDrifted-onnx-static" in drift_only.stderr
    lenient = export_sweep("report", run, "--baseline", baseline, "--fail-on", "vanished,stage-moved,fixed")
    assert lenient.returncode == 1
    assert export_sweep("report", run, "--baseline", baseline, "--fail-on", "new-pass").returncode == 1


def test_a_clean_night_exits_0(tmp_path):
    baseline = write_run(tmp_path / "baseline", [record("ModelA"), record("ModelB", "fail", "torch-export")])
    run = write_run(tmp_path / "run", [record("ModelA"), record("ModelB", "fail", "torch-export")],
                    plan=plan_of(["ModelA", "ModelB"]))  # fmt: skip
    result = export_sweep("report", run, "--baseline", baseline)
    assert result.returncode == 0, result.stderr
    assert "unchanged 2" in result.stderr


def test_pass_rates_count_missing_cells_as_not_passing(nights):
    from reports import data

    run, _baseline = nights
    tile = next(t for t in data.tiles(data.RunView.load(run)) if t["backend"] == "onnx")
    assert (tile["passed"], tile["total"]) == (4, 8)  # 7 records, 1 missing
    assert tile["counts"]["missing"] == 1


def test_merge_names_a_missing_shard_and_its_cells_are_missing(tmp_path):
    models = [f"Model{i}" for i in range(6)]
    plan = plan_of(models, shards=3)
    plan.save(tmp_path / "plan.json")
    shards = []
    for index in (1, 3):  # shard 2 never came back
        cells = [record(name) for name in plan.class_names(index)]
        shards.append(write_run(tmp_path / f"shard-{index}", cells, plan=plan, shard=index))
    result = export_sweep("merge", tmp_path / "merged", *shards)
    assert result.returncode == 1, result.stderr
    assert "shard 2/3 is missing" in result.stderr
    lost = [f"{name}-onnx-static" for name in plan.class_names(2)]
    assert all(cell in result.stderr for cell in lost)
    frame = compare_runs(tmp_path / "merged")
    assert sorted(frame[frame.kind == "missing"].cell_id) == sorted(lost)
    assert json.loads((tmp_path / "merged" / "run.json").read_text())["missing_shards"] == [2]


def test_a_failed_merge_leaves_nothing_behind_and_can_be_retried(tmp_path):
    plan = plan_of([f"Model{i}" for i in range(4)], shards=2)
    one = write_run(tmp_path / "shard-1", [record(n) for n in plan.class_names(1)], plan=plan, shard=1)
    two = write_run(tmp_path / "shard-2", [record(n) for n in plan.class_names(2)], plan=plan, shard=2)
    broken = two / "cells" / f"{plan.class_names(2)[0]}-onnx-static.json"
    good = broken.read_text()
    broken.write_text(good[: len(good) // 2])  # a record cut in half, in the last shard
    out = tmp_path / "merged"
    result = export_sweep("merge", out, one, two)
    assert result.returncode == 2 and "truncated" in result.stderr and broken.name in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".merged.*")), "no half-written folder"

    broken.write_text(good)
    again = export_sweep("merge", out, one, two)
    assert again.returncode == 0, again.stderr
    assert len(RunStore(out).cell_ids()) == 4


def test_merge_refuses_a_cell_in_two_shards_before_writing_anything(tmp_path):
    plan = plan_of(["ModelA", "ModelB"], shards=2)
    one = write_run(tmp_path / "one", [record("ModelA")], plan=plan, shard=1)
    two = write_run(tmp_path / "two", [record("ModelB"), record("ModelA")], plan=plan, shard=2)
    result = export_sweep("merge", tmp_path / "merged", one, two)
    assert result.returncode == 2 and "ModelA-onnx-static is in both" in result.stderr
    assert not (tmp_path / "merged").exists()
