"""pytest drives the sweep when asked: ``pytest -n auto --sweep=smoke`` gives one test item per cell
(``LlamaForCausalLM-onnx-dynamic``), all cells of a class on one xdist worker (so the class is built once), every
worker writing its records into one run folder. Without ``--sweep`` only the project's own tests run.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

SWEEP_DIR = Path(__file__).parent / "tests" / "sweep"


def pytest_addoption(parser):
    group = parser.getgroup("export-sweep")
    group.addoption("--sweep", help="run the export sweep as tests: smoke, all, or class names and globs")
    group.addoption("--backends", default="dynamo,onnx,executorch", help="sweep backends (comma-separated)")
    group.addoption("--shapes", default="static,dynamic", help="sweep shape modes: static,dynamic,generate")
    group.addoption("--shard", help="sweep shard i/N, balanced by the previous run's class times")
    group.addoption("--shard-weights", help="run folder whose class times balance the shards")
    group.addoption("--sweep-out", help="sweep run folder (default runs/<date-time>)")
    group.addoption("--sweep-resume", action="store_true", help="continue the run in --sweep-out")
    group.addoption("--sweep-timeout", type=float, default=600.0, help="seconds per cell")
    group.addoption("--sweep-memory-cap", type=float, help="MB of resident memory per worker")
    group.addoption("--sweep-no-cache", action="store_true", help="run every cell, even unchanged ones")
    group.addoption("--sweep-baseline", help="earlier run folder: the dashboard shows regressions against it")
    group.addoption("--registry", help="another registry file")
    group.addoption("--stale", action="store_true", help="nightly stale check: one test item per registry entry")


def _sweeping(config) -> bool:
    return bool(config.getoption("--sweep") or config.getoption("--stale"))


def pytest_ignore_collect(collection_path, config):
    # The sweep's test module only exists for --sweep / --stale; the unit tests only run without them.
    path = Path(collection_path)
    inside = SWEEP_DIR in path.parents or path == SWEEP_DIR
    if inside:
        if path.name == "test_sweep.py":
            return None if config.getoption("--sweep") else True
        if path.name == "test_stale.py":
            return None if config.getoption("--stale") else True
        return None if _sweeping(config) else True
    if _sweeping(config) and Path(collection_path).is_file() and Path(collection_path).suffix == ".py":
        return True
    return None


def pytest_configure(config):
    if not _sweeping(config):
        return
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"  # all cells of a class on one worker: the model is built once
    if hasattr(config, "workerinput"):  # an xdist worker: the controller chose the run folder
        config.sweep_run_dir = Path(config.workerinput["sweep_run_dir"])
        return
    from harness.store import RunStore, now

    config.sweep_started_at = now()  # the cache takes only what this session made (a resumed run holds older records)
    out = config.getoption("--sweep-out") or os.path.join("runs", datetime.now().strftime("%Y-%m-%d_%H%M%S"))
    config.sweep_run_dir = Path(out)
    options = {
        "sweep": config.getoption("--sweep"), "backends": config.getoption("--backends").split(","),
        "shapes": config.getoption("--shapes").split(","), "shard": config.getoption("--shard"),
        "registry": config.getoption("--registry"), "stale": config.getoption("--stale"), "driver": "pytest",
    }  # fmt: skip
    RunStore(out).create(options, resume=config.getoption("--sweep-resume"))


def pytest_configure_node(node):
    if _sweeping(node.config):
        node.workerinput["sweep_run_dir"] = str(node.config.sweep_run_dir)


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _sweeping(config) or hasattr(config, "workerinput"):
        return
    from harness.store import RunStore

    store = RunStore(config.sweep_run_dir)
    counts = {}
    for record in store.records():
        counts[record.status] = counts.get(record.status, 0) + 1
    store.finish(counts=counts)
    if not config.getoption("--sweep-no-cache"):
        from harness.cache import ResultCache
        from registry import Registry

        ResultCache(None, Registry.load(config.getoption("--registry"))).save_from(store, since=config.sweep_started_at)
    findings = sorted((config.sweep_run_dir / "stale").glob("*.json"))
    if findings:  # the stale items' findings, one file per entry, become the dashboard's stale.json
        from datetime import datetime, timezone

        entries = [json.loads(path.read_text()) for path in findings]
        stale = {"checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "entries": entries}
        (config.sweep_run_dir / "stale.json").write_text(json.dumps(stale, indent=1))
    from reports import write_report

    site = write_report(config.sweep_run_dir, baseline=config.getoption("--sweep-baseline"))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"export-sweep: {sum(counts.values())} cells {counts}; dashboard: {site / 'index.html'}")
