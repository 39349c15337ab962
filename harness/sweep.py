"""The sweep: every selected cell, ``jobs`` model classes at a time, each in its own warm worker.

Records go to the run folder the moment a cell ends, so a killed sweep keeps every finished cell and ``resume``
skips them. The parent is single-threaded (it forks), and waits on all children's pipes at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from .cells import Cell
from .models import ModelClass
from .records import DTYPES, STATUSES, CellRecord, parse_cell_id
from .store import RunStore
from .workers import ClassWorker, WorkerOptions


def cells_of(model: ModelClass, backends, shapes, dtypes=DTYPES[:1]) -> list[Cell]:
    """A class' cells: every backend, shape mode and dtype, generate mode only for classes that generate text."""
    return [
        Cell(model, backend, shape, dtype)
        for backend in backends
        for shape in shapes
        for dtype in dtypes
        if shape != "generate" or model.generative
    ]


@dataclass
class Plan:
    """What to run: the cells of each class, in class order."""

    classes: list[ModelClass]
    backends: tuple[str, ...]
    shapes: tuple[str, ...]
    dtypes: tuple[str, ...] = DTYPES[:1]
    done: set[str] = field(default_factory=set)  # cell ids already in the run folder (resume)
    only: set[str] | None = None  # just these cell ids (the stale check re-runs the cells an entry governs)

    def cells(self, model: ModelClass) -> list[Cell]:
        cells = cells_of(model, self.backends, self.shapes, self.dtypes)
        return [c for c in cells if c.id not in self.done and (self.only is None or c.id in self.only)]

    @property
    def total(self) -> int:
        return sum(len(self.cells(model)) for model in self.classes)


class Progress:
    """One live line: cells done, counts per status, elapsed time and ETA. Plain lines when not on a terminal.

    With ``estimates`` (seconds per cell id, from the baseline's records) the ETA weighs what is left by what it cost
    last time, scaled by how this run compares so far: a sweep's heavy ExecuTorch classes do not all come last."""

    def __init__(self, total: int, stream=None, every: float = 0.5, estimates: dict[str, float] | None = None,
                 pending: list[str] | None = None):  # fmt: skip
        stream = stream if stream is not None else sys.stderr
        self.total, self.stream, self.every = total, stream, every
        self.estimates = estimates or {}
        self.pending_estimate = sum(self.estimates.get(cell, 0.0) for cell in pending or [])
        self.done_estimate = 0.0
        self.counts: Counter = Counter()
        self.done = 0
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.live = stream.isatty()
        self.last_plain = 0

    def add(self, record: CellRecord) -> None:
        self.done += 1
        self.counts[record.status] += 1
        self.done_estimate += self.estimates.get(record.cell_id, 0.0)
        self.draw()

    def eta(self, elapsed: float) -> float | None:
        if not self.done:
            return None
        if self.done_estimate > 0 and self.pending_estimate > self.done_estimate:
            return elapsed / self.done_estimate * (self.pending_estimate - self.done_estimate)
        return elapsed / self.done * (self.total - self.done)

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        eta = self.eta(elapsed)
        counts = " ".join(f"{status} {self.counts[status]}" for status in STATUSES if self.counts[status])
        return (
            f"[{self.done}/{self.total} cells] {counts or '-'} | {_clock(elapsed)} elapsed"
            + (f", ETA {_clock(eta)}" if eta is not None and self.done < self.total else "")
        )

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.live:
            if force or now - self.last_draw >= self.every or self.done == self.total:
                self.stream.write("\r\033[K" + self.line())
                self.stream.flush()
                self.last_draw = now
        elif force or self.done == self.total or self.done - self.last_plain >= max(1, self.total // 20):
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self.last_plain = self.done

    def close(self) -> None:
        if self.live or self.last_plain != self.done:  # the last plain line already says it all
            self.draw(force=True)
        if self.live:
            self.stream.write("\n")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_sweep(
    plan: Plan,
    store: RunStore,
    options: WorkerOptions,
    jobs: int = 1,
    registry=None,
    progress: Progress | None = None,
    reuse=None,
) -> Counter:
    """Run the plan; returns counts per status. ``reuse(cell) -> record | None`` serves cached results."""
    if jobs < 1:
        raise ValueError(f"jobs must be 1 or more, not {jobs}")
    progress = progress or Progress(plan.total)
    counts: Counter = Counter()
    queue = [(model, plan.cells(model)) for model in plan.classes]
    queue = [(model, cells) for model, cells in queue if cells]
    active: list[tuple[ClassWorker, list[Cell]]] = []
    worker_number = 0

    def finish(record: CellRecord) -> None:
        store.write(record)
        counts[record.status] += 1
        progress.add(record)

    def next_cell(worker: ClassWorker, cells: list[Cell]) -> bool:
        """Submit the worker's next cell; False when its class is done."""
        while cells:
            cell = cells.pop(0)
            cached = reuse(cell) if reuse else None
            if cached is not None:
                finish(cached)
                continue
            record = worker.submit(cell)
            if record is None:
                return True
            finish(record)
        worker.close()
        return False

    try:
        while queue or active:
            while queue and len(active) < jobs:
                model, cells = queue.pop(0)
                worker_number += 1
                worker = ClassWorker(model, options, registry, name=f"{os.getpid()}.{worker_number % jobs}")
                if next_cell(worker, cells):
                    active.append((worker, cells))
            if not active:
                continue
            wait([worker.connection for worker, _ in active if worker.connection], timeout=options.poll_interval)
            for entry in list(active):
                worker, cells = entry
                record = worker.poll()
                if record is None:
                    continue
                finish(record)
                if not next_cell(worker, cells):
                    active.remove(entry)
    finally:
        for worker, _cells in active:
            worker.close()
        progress.close()
    return counts


def run_cells(cell_ids, store: RunStore, options: WorkerOptions, jobs: int = 1, registry=None,
              progress: Progress | None = None) -> dict[str, CellRecord]:  # fmt: skip
    """Run exactly these cells into ``store`` (the stale checks re-run chosen cells); returns their records by id.
    A cell whose class the installed transformers no longer has is left out."""
    from .models import all_model_classes

    known = all_model_classes()
    wanted = [cell for cell in dict.fromkeys(cell_ids) if parse_cell_id(cell)[0] in known]
    if not wanted:
        return {}
    models, backends, shapes, dtypes = (tuple(dict.fromkeys(part)) for part in zip(*map(parse_cell_id, wanted)))
    plan = Plan([known[name] for name in models], backends, shapes, dtypes, only=set(wanted))
    run_sweep(plan, store, options, jobs, registry, progress or Progress(plan.total))
    present = store.cell_ids()
    return {cell: store.read(cell) for cell in wanted if cell in present}
