"""The sweep harness: every transformers model class, a tiny model for each, every backend, results by stage.

    import harness
    frame = harness.load_run("runs/2026-11-29_120000")   # one row per cell
    changes = harness.compare_runs("runs/tonight", "runs/last-night")   # one row per cell, its change ``kind``
"""

from .compare import CHANGE_KINDS, compare_runs
from .records import SHAPE_MODES, STATUSES, CellRecord, StageRecord, cell_id, error_signature
from .store import CorruptRecordError, RunStore, load_run

__all__ = [
    "SHAPE_MODES", "STATUSES", "CellRecord", "StageRecord", "cell_id", "error_signature", "CorruptRecordError",
    "RunStore", "load_run", "compare_runs", "CHANGE_KINDS",
]  # fmt: skip
