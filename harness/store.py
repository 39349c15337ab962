"""A run is a folder: ``run.json`` (what ran, where, with which versions) and ``cells/<cell id>.json``.

Each cell record is written to a temporary file and renamed into place, so a killed sweep leaves only whole
records, and parallel writers (xdist workers, shards) never touch the same file. ``load_run`` reads a run as a
pandas DataFrame, one row per cell; a record that does not parse is an error naming its file and line.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .records import CellRecord

RUN_FILE = "run.json"
PLAN_FILE = "plan.json"
CELLS_DIR = "cells"
LOGS_DIR = "logs"  # each class's worker output: one file per class, each cell's part opened by a marker line
CELL_LOG_MARKER = "==> export-sweep cell "
CELL_LOG_KEPT = 30_000  # characters of a cell's log a reader gets: its end, where a failure is told
_RUN_TYPES = {"started_at": (str, type(None)), "finished_at": (str, type(None)), "options": (dict,),
              "versions": (dict,), "sessions": (list,), "machine": (dict,), "counts": (dict,),
              "git_sha": (str, type(None)), "plan": (dict, type(None)), "shards": (list,)}  # fmt: skip
COLUMNS = [
    "cell_id", "model_class", "model_type", "task", "backend", "shape_mode", "dtype", "status", "stage", "seconds",
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


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, rename it into place and fsync the folder: a
    reader sees the old file or the new one, never a cut one, whatever happens (a full disk, a kill)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise OSError(error.errno, f"cannot write {path} ({error.strerror})") from None
    try:
        # the file keeps its mode (mkstemp's is 0600: a registry must stay readable by whoever read it before)
        os.fchmod(handle, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(handle, "w", encoding="utf-8", errors="surrogatepass") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
            raise OSError(error.errno, f"cannot write {path} ({error.strerror or error})") from None
        raise
    fsync_folder(path.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, default=str))


def read_json(path: Path) -> dict:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as error:
        raise CorruptRecordError(f"{path}: cannot read ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise CorruptRecordError(
            f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start})"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        # a file cut short ends inside its last value, or inside a string that never closes
        cut = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")
        what = "truncated" if cut else "not valid JSON"
        raise CorruptRecordError(f"{path}:{error.lineno}: {what} ({error.msg}, column {error.colno})") from None
    if not isinstance(data, dict):
        raise CorruptRecordError(f"{path}:1: expected a JSON object, found {type(data).__name__}")
    return data


class RunStore:
    """Reads and writes one run folder."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.cells_dir = self.directory / CELLS_DIR
        self.logs_dir = self.directory / LOGS_DIR

    # ── run metadata ──
    def create(self, options: dict, resume: bool = False, plan=None, shard: int | None = None) -> dict:
        """Start a run here; with ``resume``, continue the one already here. Refuses to mix two runs.

        Everything is checked before anything is written: resuming a folder whose records do not all parse, or
        with a plan other than the one it started with, changes nothing in it."""
        existing = self.cell_ids()
        if existing and not resume:
            raise FileExistsError(
                f"{self.directory} already holds {len(existing)} cell records: pass --resume to continue that run, "
                "or choose another --out folder"
            )
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"{self.directory} is a file, not a run folder: choose another --out")
        metadata: dict = {}
        if resume and (self.directory / RUN_FILE).exists():
            metadata = self.metadata()
            self.records()  # a corrupt record stops the resume here, before run.json changes
            if plan is not None:
                self._check_same_plan(metadata, options, plan, shard)
        from exporters.versions import package_versions

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
            }
        )
        metadata.setdefault("options", options)  # a resumed run keeps the options it started with
        metadata.setdefault("started_at", now())
        session = {"started_at": now(), "resumed": bool(resume and existing)}
        if options.get("argv") is not None:
            session["argv"] = options["argv"]
        metadata.setdefault("sessions", []).append(session)
        metadata.pop("finished_at", None)
        if plan is not None:
            plan.save(self.directory / PLAN_FILE)
            metadata["plan"] = {"digest": plan.digest, "shard": shard, "shards": plan.shards, "cells": len(plan.cells(shard))}
        write_json_atomic(self.directory / RUN_FILE, metadata)
        return metadata

    def _check_same_plan(self, metadata: dict, options: dict, plan, shard: int | None) -> None:
        """A resume runs the plan the run started with: other classes, backends or shapes would mix two runs."""
        started = metadata.get("plan") or {}
        if started:
            if (started.get("digest"), started.get("shard")) != (plan.digest, shard):
                raise ValueError(
                    f"{self.directory} was started with another selection (plan {started.get('digest')}, shard "
                    f"{started.get('shard')}; now plan {plan.digest}, shard {shard}): resume it with the options it "
                    f"started with ({' '.join(metadata.get('options', {}).get('argv') or []) or 'see its run.json'})"
                )
            return
        # a run from before plans: its options say what it was to run
        before = metadata.get("options", {})
        keys = ("models", "model_types", "tasks", "limit", "shard", "backends", "shapes")
        differ = [key for key in keys if key in before and before.get(key) != options.get(key)]
        if differ:
            raise ValueError(
                f"{self.directory} was started with other options ({', '.join(f'{k}={before.get(k)!r}' for k in differ)}): "
                "resume it with the options it started with"
            )

    def metadata(self) -> dict:
        path = self.directory / RUN_FILE
        data = read_json(path)
        for key, kinds in _RUN_TYPES.items():
            if key in data and not isinstance(data[key], kinds):
                names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
                raise CorruptRecordError(f"{path}: field {key!r} must be {names}, found {type(data[key]).__name__}")
        return data

    def finish(self, **extra) -> dict:
        metadata = self.metadata()
        metadata["finished_at"] = now()
        if metadata.get("sessions"):
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

    def records(self, errors: list[str] | None = None) -> list[CellRecord]:
        """Every record; a corrupt one raises, or with ``errors`` is left out and its message appended there."""
        if not self.cells_dir.is_dir():
            return []
        records = []
        for path in sorted(self.cells_dir.glob("*.json")):
            try:
                records.append(self._parse(path))
            except CorruptRecordError as error:
                if errors is None:
                    raise
                errors.append(str(error))
        return records

    def cell_log(self, record: CellRecord) -> str | None:
        """What the cell's worker wrote while it ran the cell (native libraries' logs, warnings, a crash's last
        words), its last ``CELL_LOG_KEPT`` characters; None when the run kept no log of it."""
        if not _plain_name(record.model_class):  # a record is a file anyone can write: no path out of logs/
            return None
        try:
            text = (self.logs_dir / f"{record.model_class}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        start = text.rfind(f"{CELL_LOG_MARKER}{record.cell_id}\n")  # the last: a resumed run appends
        if start < 0:
            return None
        start = text.index("\n", start) + 1
        end = text.find(f"\n{CELL_LOG_MARKER}", start)
        part = text[start : end if end >= 0 else len(text)].strip("\n")
        return part[-CELL_LOG_KEPT:]

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


def _plain_name(name: str | None) -> bool:
    return bool(name) and re.fullmatch(r"\w[\w.-]*", name) is not None


def require_run(directory: str | Path, what: str = "run") -> RunStore:
    """The store of an existing run folder; a path that is none is named (never read as an empty run)."""
    store = RunStore(directory)
    if not store.directory.exists():
        raise FileNotFoundError(f"{what} {store.directory}: no such folder")
    if not (store.directory / RUN_FILE).exists() and not store.cells_dir.is_dir():
        raise FileNotFoundError(f"{what} {store.directory} is not a run folder (no {RUN_FILE}, no {CELLS_DIR}/)")
    return store


def load_run(directory: str | Path):
    """One row per cell, with the stable columns in ``COLUMNS`` (plus ``tasks`` and ``applied`` as lists)."""
    import pandas

    store = require_run(directory)
    rows = []
    for record in store.records():
        row = {column: getattr(record, column, None) for column in COLUMNS if column != "cell_id"}
        row.update(cell_id=record.cell_id, tasks=record.tasks, applied=record.applied)
        rows.append(row)
    return pandas.DataFrame(rows, columns=[*COLUMNS, "tasks", "applied"])
