"""The sweep harness: every transformers model class, a tiny model for each, every backend, results by stage.

    import harness
    frame = harness.load_run("runs/2026-11-29_120000")   # one row per cell
"""

from .records import SHAPE_MODES, STATUSES, CellRecord, StageRecord, cell_id, error_signature
from .store import CorruptRecordError, RunStore, load_run

__all__ = [
    "SHAPE_MODES", "STATUSES", "CellRecord", "StageRecord", "cell_id", "error_signature", "CorruptRecordError",
    "RunStore", "load_run",
]  # fmt: skip
