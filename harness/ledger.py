"""The workaround ledger of a run: every workaround its code registered, with what it waits for, the cells it fired on
(the records' ``applied``) and which of those failed.

A run keeps the listing of the workarounds its code registered (``RUN/workarounds.json``, written as it starts), so
the ledger of an old run describes the code that ran, and the dashboard reads it without importing an exporter.
"""

from __future__ import annotations

import json
from pathlib import Path

from .code_index import TRACED_THROUGH
from .records import CellRecord
from .store import CorruptRecordError, read_json, write_text_atomic

WORKAROUNDS_FILE = "workarounds.json"
LISTING_FIELDS = ("name", "backend", "kind", "stage", "targets", "summary", "place", "upstream", "model_side",
                  "fixed_when")  # fmt: skip


def write_listing(run_dir: Path, rows: list[dict]) -> Path:
    path = Path(run_dir) / WORKAROUNDS_FILE
    write_text_atomic(path, json.dumps({"workarounds": rows}, indent=1))
    return path


def read_listing(run_dir: Path) -> list[dict] | None:
    """The listing a run kept, or None for a run from before listings; a malformed one is named."""
    path = Path(run_dir) / WORKAROUNDS_FILE
    if not path.is_file():
        return None
    rows = read_json(path).get("workarounds")
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and isinstance(row.get("name"), str) and isinstance(row.get("backend"), str) for row in rows
    ):
        raise CorruptRecordError(f"{path}: 'workarounds' must be a list of workarounds, each with name and backend")
    return rows


def owner(listed: set[tuple[str, str]], backend: str, name: str) -> str:
    """The backend whose workaround a cell of ``backend`` applied: its own, else one it traces through (an ONNX or
    ExecuTorch cell applies Dynamo's patches while it is traced)."""
    for candidate in (backend, *reversed(TRACED_THROUGH[backend])):
        if (candidate, name) in listed:
            return candidate
    return backend


def fired_on(records: list[CellRecord], listed: set[tuple[str, str]] = frozenset()) -> dict[tuple[str, str], list[CellRecord]]:
    """(owning backend, workaround) -> the records whose ``applied`` names it."""
    fired: dict[tuple[str, str], list[CellRecord]] = {}
    for record in records:
        for name in record.applied:
            fired.setdefault((owner(listed, record.backend, name), name), []).append(record)
    return fired


def ledger_rows(listing: list[dict], records: list[CellRecord]) -> list[dict]:
    """The listing, each row with ``fired`` (cell ids) and ``failing`` (those not passing). A name a record applied
    that the listing lacks (a workaround since removed) gets a row of its own, marked ``unlisted``."""
    fired = fired_on(records, {(entry["backend"], entry["name"]) for entry in listing})
    rows = []
    for entry in listing:
        cells = fired.pop((entry["backend"], entry["name"]), [])
        rows.append({**entry, "fired": sorted(r.cell_id for r in cells),
                     "failing": sorted(r.cell_id for r in cells if r.status != "pass")})  # fmt: skip
    for (backend, name), cells in sorted(fired.items()):
        rows.append({"name": name, "backend": backend, "kind": "unlisted", "stage": "", "targets": [],
                     "summary": "applied by this run's records, not registered by its code", "place": "",
                     "upstream": None, "model_side": None, "fixed_when": None,
                     "fired": sorted(r.cell_id for r in cells),
                     "failing": sorted(r.cell_id for r in cells if r.status != "pass")})  # fmt: skip
    return rows
