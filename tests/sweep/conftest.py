"""Sweep items: one per cell, parametrized from the --sweep selection; a warm worker per model class."""

from __future__ import annotations

import pytest


def _selection(config):
    from harness.cli import select_classes
    from harness.records import SHAPE_MODES

    from exporters.backends import BACKENDS

    class Args:
        models = config.getoption("--sweep")
        model_types = tasks = limit = None
        shard = config.getoption("--shard")
        shard_weights = config.getoption("--shard-weights")

    backends = [b for b in config.getoption("--backends").split(",") if b]
    shapes = [s for s in config.getoption("--shapes").split(",") if s]
    for value, known in [(backends, BACKENDS), (shapes, SHAPE_MODES)]:
        unknown = [v for v in value if v not in known]
        if unknown:
            raise pytest.UsageError(f"unknown {unknown[0]!r}: choose from {', '.join(known)}")
    try:
        classes = select_classes(Args)
    except LookupError as error:
        raise pytest.UsageError(str(error)) from None
    return classes, backends, shapes


def pytest_generate_tests(metafunc):
    if "stale_entry" in metafunc.fixturenames and metafunc.config.getoption("--stale"):
        from registry import Registry

        entries = Registry.load(metafunc.config.getoption("--registry")).entries
        ids = [f"{e.list}-{e.model}-{e.scope}" for e in entries]
        metafunc.parametrize("stale_entry", [pytest.param(e, marks=pytest.mark.xdist_group(e.model)) for e in entries], ids=ids)
        return
    if "sweep_cell" not in metafunc.fixturenames or not metafunc.config.getoption("--sweep"):
        return
    from harness.sweep import cells_of

    classes, backends, shapes = _selection(metafunc.config)
    cells = [cell for model in classes for cell in cells_of(model, backends, shapes)]
    metafunc.parametrize(
        "sweep_cell",
        [pytest.param(cell, marks=pytest.mark.xdist_group(cell.model.name)) for cell in cells],
        ids=[cell.id for cell in cells],
    )


class SweepSession:
    """The per-process state of a sweep under pytest: the run folder, the registry, the current class' worker."""

    def __init__(self, config):
        from harness.cache import ResultCache
        from harness.store import RunStore
        from harness.workers import WorkerOptions, warm_imports
        from registry import Registry

        backends = config.getoption("--backends").split(",")
        warm_imports(backends)
        self.store = RunStore(config.sweep_run_dir)
        self.done = self.store.cell_ids() if config.getoption("--sweep-resume") else set()
        self.registry = Registry.load(config.getoption("--registry"))
        self.cache = None if config.getoption("--sweep-no-cache") else ResultCache(None, self.registry)
        worker_id = getattr(config, "workerinput", {}).get("workerid", "main")
        self.options = WorkerOptions(
            timeout=config.getoption("--sweep-timeout"), memory_cap_mb=config.getoption("--sweep-memory-cap"),
            threads=1, log_dir=self.store.directory / "logs",
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
