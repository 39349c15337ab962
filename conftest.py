"""pytest drives the sweep when asked: ``pytest -n auto --sweep=smoke`` gives one test item per cell
(``test_cell[LlamaForCausalLM-onnx-dynamic]``), all cells of a class on one xdist worker (so the class is built
once), every worker writing its records into one run folder. Without ``--sweep`` only the project's own tests run.

With ``--sweep-baseline=RUN`` the exit status says whether something got worse: a cell that also fails in the
baseline is ``xfail`` (its bucket as the reason), a regression or a new failure fails, a fixed cell is ``XPASS``,
and cells the plan expected but nobody ran (a crashed worker) fail the session.
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
    group.addoption("--dtypes", default="float32", help="sweep dtypes: float32,bfloat16,float16")
    group.addoption("--shard", help="sweep shard i/N, balanced by --shard-weights or as --sweep-plan says")
    group.addoption("--shard-weights", help="run folder whose class times balance the shards")
    group.addoption("--sweep-plan", help="plan file (export-sweep plan): which classes each shard runs")
    group.addoption("--sweep-sample", type=int, help="this many of the selected classes, drawn with --sweep-seed")
    group.addoption("--sweep-seed", type=int, default=0, help="seed of --sweep-sample")
    group.addoption("--sweep-out", help="sweep run folder (default runs/<date-time>)")
    group.addoption("--sweep-resume", action="store_true", help="continue the run in --sweep-out")
    group.addoption("--sweep-timeout", type=float, default=600.0, help="seconds per cell")
    group.addoption("--sweep-memory-cap", type=float, help="MB of memory per cell's worker before it is killed")
    group.addoption("--sweep-no-cache", action="store_true", help="run every cell, even unchanged ones")
    group.addoption("--sweep-baseline", help="earlier run folder: its failures are xfail, the dashboard compares")
    group.addoption("--disable-workarounds", default="", help="run the sweep without these workarounds (comma-separated)")
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


def _usage(check):
    """Bad sweep options end the session with pytest's one-line usage error, not a traceback."""
    try:
        return check()
    except (LookupError, ValueError, OSError) as error:
        raise pytest.UsageError(f"export-sweep: {error}") from None


def pytest_configure(config):
    if not _sweeping(config):
        return
    from harness.plan import SweepPlan

    if hasattr(config, "workerinput"):  # an xdist worker: the controller chose the run folder and the plan
        config.sweep_run_dir = Path(config.workerinput["sweep_run_dir"])
        config.sweep_plan = SweepPlan.load(config.workerinput["sweep_plan"]) if config.workerinput["sweep_plan"] else None
        config.sweep_shard = config.workerinput["sweep_shard"]
        return
    from harness.store import RunStore, now

    config.sweep_started_at = now()  # the cache takes only what this session made (a resumed run holds older records)
    out = config.getoption("--sweep-out") or os.path.join("runs", datetime.now().strftime("%Y-%m-%d_%H%M%S"))
    config.sweep_run_dir = Path(out)
    config.sweep_plan, config.sweep_shard = None, None
    if config.getoption("--sweep"):
        config.sweep_plan, config.sweep_shard = _usage(lambda: _plan(config))
    baseline = config.getoption("--sweep-baseline")
    if baseline:
        from harness.store import require_run

        _usage(lambda: require_run(baseline, "--sweep-baseline"))
    if _disabled(config):
        from commands.sweep import check_workaround_names

        _usage(lambda: check_workaround_names(_disabled(config)))
    if config.option.collectonly:  # a look at the items writes nothing
        return
    options = {
        "sweep": config.getoption("--sweep"), "backends": config.getoption("--backends").split(","),
        "shapes": config.getoption("--shapes").split(","), "dtypes": config.getoption("--dtypes").split(","), "shard": config.getoption("--shard"),
        "registry": config.getoption("--registry"), "stale": config.getoption("--stale"), "driver": "pytest",
        "disabled_workarounds": _disabled(config),
    }  # fmt: skip
    _usage(lambda: RunStore(out).create(options, resume=config.getoption("--sweep-resume"), plan=config.sweep_plan,
                                        shard=config.sweep_shard))  # fmt: skip


def _disabled(config) -> list[str]:
    return [name.strip() for name in config.getoption("--disable-workarounds").split(",") if name.strip()]


def _plan(config):
    """The plan of this session's cells, from the sweep options (or the --sweep-plan file)."""
    from harness.plan import select_plan
    from harness.records import DTYPES, SHAPE_MODES

    from exporters.backends import BACKENDS

    backends = [b for b in config.getoption("--backends").split(",") if b]
    shapes = [s for s in config.getoption("--shapes").split(",") if s]
    dtypes = [d for d in config.getoption("--dtypes").split(",") if d]
    for value, known in [(backends, BACKENDS), (shapes, SHAPE_MODES), (dtypes, DTYPES)]:
        unknown = [v for v in value if v not in known]
        if unknown:
            raise ValueError(f"unknown {unknown[0]!r}: choose from {', '.join(known)}")
    plan_file = config.getoption("--sweep-plan")

    weights = config.getoption("--shard-weights")
    defaults = ("dynamo,onnx,executorch", "static,dynamic", "float32")
    given = (config.getoption("--backends"), config.getoption("--shapes"), config.getoption("--dtypes")) != defaults
    given = given or not plan_file
    return select_plan(
        config.getoption("--sweep") if not plan_file else "all", sample=config.getoption("--sweep-sample"),
        seed=config.getoption("--sweep-seed"), shard=config.getoption("--shard"),
        shard_weights=Path(weights) if weights else None, plan_file=Path(plan_file) if plan_file else None,
        backends=backends if given else None, shapes=shapes if given else None, dtypes=dtypes if given else None,
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """All cells of a class on one worker, so the class is built once. xdist's own loadgroup cannot do it with
    pytest 9.2: it tags items by rewriting a node id field pytest no longer reads
    (https://github.com/pytest-dev/pytest-xdist/issues/1386), so the cells of a class would be spread."""
    if not _sweeping(config) or config.getvalue("dist") not in ("load", "loadgroup", "worksteal"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModelClass(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            inside = nodeid.partition("[")[2].rstrip("]")
            parts = inside.split("-")
            if len(parts) < 3:
                return nodeid
            # test_cell[BertModel-onnx-static], test_stale_entry[EXPORT_SKIPS-BertModel-onnx.static]
            return parts[1] if "::test_stale" in nodeid else parts[0]

    return ByModelClass(config, log)


def pytest_configure_node(node):
    if _sweeping(node.config):
        config = node.config
        node.workerinput["sweep_run_dir"] = str(config.sweep_run_dir)
        plan_file = config.sweep_run_dir / "plan.json"
        node.workerinput["sweep_plan"] = str(plan_file) if config.sweep_plan is not None and plan_file.is_file() else ""
        node.workerinput["sweep_shard"] = config.sweep_shard


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not _sweeping(config) or hasattr(config, "workerinput") or config.option.collectonly:
        return
    from harness.store import RunStore

    store = RunStore(config.sweep_run_dir)
    counts = {}
    for record in store.records(errors=[]):
        counts[record.status] = counts.get(record.status, 0) + 1
    store.finish(counts=counts)
    cache = None
    if not config.getoption("--sweep-no-cache") and not _disabled(config):
        from harness.cache import ResultCache
        from registry import Registry

        cache = ResultCache(None, Registry.load(config.getoption("--registry")))
    if config.getoption("--sweep") and not (cache is not None and cache.copy_listing(config.sweep_run_dir)):
        from exporters.workarounds import ledger
        from harness.ledger import write_listing

        write_listing(config.sweep_run_dir, ledger(tuple(config.sweep_plan.backends)))  # the code that ran
    if cache is not None:
        cache.save_from(store, since=config.sweep_started_at)
    findings = sorted((config.sweep_run_dir / "stale").glob("*.json"))
    if findings:  # the stale items' findings, one file per entry, become the dashboard's stale.json
        from datetime import timezone

        from harness.store import write_text_atomic

        entries = [json.loads(path.read_text()) for path in findings]
        stale = {"checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "entries": entries}
        write_text_atomic(config.sweep_run_dir / "stale.json", json.dumps(stale, indent=1))
    from reports import write_report

    baseline = config.getoption("--sweep-baseline")
    site = write_report(config.sweep_run_dir, baseline=baseline)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"export-sweep: {sum(counts.values())} cells {counts}; dashboard: {site / 'index.html'}")


def pytest_collection_finish(session):
    if _sweeping(session.config) and not hasattr(session.config, "workerinput"):
        _record_selection(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if _sweeping(node.config):
        _record_selection(node.config, ids)


def _record_selection(config, nodeids) -> None:
    """What this session runs, when it is less than its plan (-k, --lf, --deselect): cells left out on purpose
    are not missing."""
    if config.sweep_plan is None or config.option.collectonly or getattr(config, "sweep_selection_recorded", False):
        return
    config.sweep_selection_recorded = True
    from harness.store import RunStore, write_json_atomic

    selected = sorted(nodeid.split("[", 1)[1][:-1] for nodeid in nodeids if "::test_cell[" in nodeid)
    if set(selected) == set(config.sweep_plan.cells(config.sweep_shard)):
        return
    store = RunStore(config.sweep_run_dir)
    metadata = store.metadata()
    metadata.setdefault("plan", {})["selected"] = selected
    write_json_atomic(store.directory / "run.json", metadata)
