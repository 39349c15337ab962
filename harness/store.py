"""A run is a folder: ``run.json`` (what ran, where, with which versions) and ``cells/<cell id>.json``.

Each cell record is written to a temporary file and renamed into place, so a killed sweep leaves only whole
records, and parallel writers (xdist workers, shards) never touch the same file. ``load_run`` reads a run as a
pandas DataFrame, one row per cell; a record that does not parse is an error naming its file and line.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .records import CellRecord

RUN_FILE = "run.json"
CELLS_DIR = "cells"
COLUMNS = [
    "cell_id", "model_class", "model_type", "task", "backend", "shape_mode", "status", "stage", "seconds",
    "max_abs_diff", "max_rel_diff", "atol", "rtol", "error_type", "error_signature", "message", "input_set",
    "reused", "worker", "peak_rss_mb",
]  # fmt: skip


class CorruptRecordError(ValueError):
    """A file in a run folder does not hold a valid record."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_sha(directory: Path | None = None) -> str | None:
    directory = directory or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory, capture_output=True,
            text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        return f"{sha}-dirty" if dirty else sha
    except (OSError, subprocess.SubprocessError):
        return None


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(data, stream, indent=1, default=str)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as error:
        raise CorruptRecordError(f"{path}: cannot read ({error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        what = "truncated" if error.pos >= len(text.rstrip()) else "not valid JSON"
        raise CorruptRecordError(f"{path}:{error.lineno}: {what} ({error.msg}, column {error.colno})") from None
    if not isinstance(data, dict):
        raise CorruptRecordError(f"{path}:1: expected a JSON object, found {type(data).__name__}")
    return data


class RunStore:
    """Reads and writes one run folder."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.cells_dir = self.directory / CELLS_DIR

    # ── run metadata ──
    def create(self, options: dict, resume: bool = False) -> dict:
        """Start a run here; with ``resume``, continue the one already here. Refuses to mix two runs."""
        existing = self.cell_ids()
        if existing and not resume:
            raise FileExistsError(
                f"{self.directory} already holds {len(existing)} cell records: pass --resume to continue that run, "
                "or choose another --out folder"
            )
        from exporters.exported import package_versions

        metadata = self.metadata() if (resume and (self.directory / RUN_FILE).exists()) else {}
        metadata.update(
            {
                "versions": package_versions(),
                "git_sha": git_sha(),
                "machine": {
                    "host": socket.gethostname(),
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                },
                "options": options,
            }
        )
        metadata.setdefault("started_at", now())
        metadata.setdefault("sessions", []).append({"started_at": now(), "resumed": bool(resume and existing)})
        metadata.pop("finished_at", None)
        write_json_atomic(self.directory / RUN_FILE, metadata)
        return metadata

    def metadata(self) -> dict:
        return read_json(self.directory / RUN_FILE)

    def finish(self, **extra) -> dict:
        metadata = self.metadata()
        metadata["finished_at"] = now()
        metadata["sessions"][-1]["finished_at"] = metadata["finished_at"]
        metadata.update(extra)
        write_json_atomic(self.directory / RUN_FILE, metadata)
        return metadata

    # ── cell records ──
    def path_for(self, cell: str) -> Path:
        return self.cells_dir / f"{cell}.json"

    def write(self, record: CellRecord) -> Path:
        path = self.path_for(record.cell_id)
        write_json_atomic(path, record.to_dict())
        return path

    def cell_ids(self) -> set[str]:
        if not self.cells_dir.is_dir():
            return set()
        return {path.stem for path in self.cells_dir.glob("*.json")}

    def read(self, cell: str) -> CellRecord:
        return self._parse(self.path_for(cell))

    def records(self) -> list[CellRecord]:
        if not self.cells_dir.is_dir():
            return []
        return [self._parse(path) for path in sorted(self.cells_dir.glob("*.json"))]

    @staticmethod
    def _parse(path: Path) -> CellRecord:
        data = read_json(path)
        try:
            record = CellRecord.from_dict(data)
        except (TypeError, ValueError) as error:
            raise CorruptRecordError(f"{path}:1: not a cell record ({error})") from None
        if record.cell_id != path.stem:
            raise CorruptRecordError(f"{path}:1: holds cell {record.cell_id!r}, not {path.stem!r}")
        return record


def load_run(directory: str | Path):
    """One row per cell, with the stable columns in ``COLUMNS`` (plus ``tasks`` and ``applied`` as lists)."""
    import pandas

    store = RunStore(directory)
    if not (store.directory / RUN_FILE).exists() and not store.cells_dir.is_dir():
        raise FileNotFoundError(f"{store.directory} is not a run folder (no {RUN_FILE}, no {CELLS_DIR}/)")
    rows = []
    for record in store.records():
        row = {column: getattr(record, column, None) for column in COLUMNS if column != "cell_id"}
        row.update(cell_id=record.cell_id, tasks=record.tasks, applied=record.applied)
        rows.append(row)
    return pandas.DataFrame(rows, columns=[*COLUMNS, "tasks", "applied"])
