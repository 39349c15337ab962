"""Sweep items: one per cell of the session's plan; a warm worker per model class. With a baseline, cells that
also fail there are xfail, with their bucket as the reason."""

from __future__ import annotations

import pytest


def _baseline_failures(config) -> dict[str, str]:
    """Cell id -> why it failed in the baseline, for the baseline's failing cells."""
    baseline = config.getoption("--sweep-baseline")
    if not baseline:
        return {}
    from harness.store import RunStore

    failures = {}
    for record in RunStore(baseline).records(errors=[]):
        if record.status != "pass":
            failures[record.cell_id] = f"fails in the baseline too: {record.error_signature or f'{record.status} at {record.stage}'}"
    return failures


def pytest_generate_tests(metafunc):
    config = metafunc.config
    if "stale_entry" in metafunc.fixturenames and config.getoption("--stale"):
        from registry import Registry

        entries = Registry.load(config.getoption("--registry")).entries
        ids = [f"{e.list}-{e.model}-{e.scope}" for e in entries]
        metafunc.parametrize("stale_entry", [pytest.param(e, marks=pytest.mark.xdist_group(e.model)) for e in entries], ids=ids)
        return
    if "sweep_cell" not in metafunc.fixturenames or not config.getoption("--sweep"):
        return
    from harness.cells import Cell
    from harness.models import all_model_classes
    from harness.records import parse_cell_id

    plan, shard = config.sweep_plan, config.sweep_shard
    known = all_model_classes()
    failures = _baseline_failures(config)
    params = []
    for name in plan.class_names(shard):
        for cell_id in plan.classes[name]["cells"]:
            _name, *cell = parse_cell_id(cell_id)
            marks = []
            if cell_id in failures:  # a failure known last night is not news; a pass is (XPASS)
                marks.append(pytest.mark.xfail(reason=failures[cell_id], strict=False))
            params.append(pytest.param(Cell(known[name], *cell), marks=marks, id=cell_id))
    metafunc.parametrize("sweep_cell", params)


class SweepSession:
    """The per-process state of a sweep under pytest: the run folder, the registry, the current class' worker."""

    def __init__(self, config):
        from harness.cache import ResultCache
        from harness.store import RunStore
        from harness.workers import WorkerOptions
        from registry import Registry

        plan = getattr(config, "sweep_plan", None)
        self.backends = plan.backends if plan is not None else config.getoption("--backends").split(",")
        self.warm = False  # warmed on the first cell that is not cached: a cached session imports no torch
        self.store = RunStore(config.sweep_run_dir)
        self.done = self.store.cell_ids() if config.getoption("--sweep-resume") else set()
        self.registry = Registry.load(config.getoption("--registry"))
        disabled = tuple(name.strip() for name in config.getoption("--disable-workarounds").split(",") if name.strip())
        cached = not config.getoption("--sweep-no-cache") and not disabled
        self.cache = ResultCache(None, self.registry) if cached else None
        worker_id = getattr(config, "workerinput", {}).get("workerid", "main")
        self.options = WorkerOptions(
            timeout=config.getoption("--sweep-timeout"), memory_cap_mb=config.getoption("--sweep-memory-cap"),
            threads=1, log_dir=self.store.logs_dir, disabled_workarounds=disabled,
        )  # fmt: skip
        self.name = worker_id
        self.worker = None

    def run(self, cell, store=None, registry="default"):
        """Run a cell (or read it back when resuming or cached). The stale check passes its own store and no
        registry: it re-runs governed cells as if their entry were gone."""
        from harness.workers import ClassWorker

        store = store or self.store
        registry = self.registry if registry == "default" else registry
        if store is self.store and cell.id in self.done:
            return store.read(cell.id)
        cached = self.cache.lookup(cell) if self.cache and registry is self.registry else None
        if cached is not None:
            store.write(cached)
            return cached
        if not self.warm:
            from harness.workers import warm_imports

            warm_imports(self.backends)
            self.warm = True
        if self.worker is None or (self.worker.model_class.name, self.worker.registry) != (cell.model.name, registry):
            self.close()
            self.worker = ClassWorker(cell.model, self.options, registry, name=self.name)
        record = self.worker.run(cell)
        store.write(record)
        return record

    def close(self):
        if self.worker is not None:
            self.worker.close()
            self.worker = None


@pytest.fixture(scope="session")
def sweep_session(request):
    session = SweepSession(request.config)
    yield session
    session.close()
