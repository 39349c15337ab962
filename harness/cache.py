"""Incremental sweeps: a cell's record is reused when nothing it depends on has changed.

The key of a cell hashes: the class' modeling and configuration source files, its tiny config, the harness code
that builds inputs and runs stages, the exporter package, the registry entries naming the class, and the
versions of transformers, torch, onnx, onnxscript, onnxruntime and executorch. Timeouts, crashes and memory
blow-ups are not cached: they depend on the machine as much as on the code.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

from .records import CellRecord
from .store import read_json, write_json_atomic

NOT_CACHED = ("timeout", "crash", "oom")
_ROOT = Path(__file__).resolve().parent.parent
# The harness files a cell's result depends on (the rest, like the CLI and progress bar, do not change results).
_HARNESS_FILES = ("cells.py", "inputs.py", "tiny.py", "tables.py", "records.py")


def default_cache_dir() -> Path:
    root = os.environ.get("EXPORT_SWEEP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "export-sweep")
    return Path(root)


def _digest(*parts: bytes | str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
        hasher.update(b"\0")
    return hasher.hexdigest()


def _file_digest(path: Path) -> str:
    try:
        return _digest(path.read_bytes())
    except OSError:
        return "missing"


def code_digest(root: Path = _ROOT) -> str:
    """The exporter package and the result-shaping harness files under ``root``, hashed together."""
    files = sorted((root / "exporters").rglob("*.py")) + [root / "harness" / name for name in _HARNESS_FILES]
    return _digest(*(f"{path.relative_to(root)}:{_file_digest(path)}" for path in files))


@cache
def _versions_digest() -> str:
    from exporters.versions import package_versions

    return _digest(json.dumps(package_versions(), sort_keys=True))


def transformers_root() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("transformers").origin).parent


def _class_sources(module: str, root: Path) -> list[Path]:
    """The modeling file that defines the class and the configuration file(s) beside it."""
    if not module:
        return []
    modeling = root.joinpath(*module.split(".")).with_suffix(".py")
    return [modeling, *sorted(modeling.parent.glob("configuration_*.py"))]


class ResultCache:
    """``code_root`` (our package) and ``source_root`` (transformers) are where the hashed files are read."""

    def __init__(self, directory: Path | None = None, registry=None, code_root: Path = _ROOT,
                 source_root: Path | None = None, salt: str = ""):  # fmt: skip
        self.directory = Path(directory) if directory else default_cache_dir()
        self.results = self.directory / "results"
        self.registry = registry
        self.source_root = source_root or transformers_root()
        self._class_keys: dict[str, str] = {}
        self._code = code_digest(code_root)
        self.salt = salt  # what else changes results (workarounds disabled for the run): another key
        self.hits = 0

    def class_key(self, model) -> str:
        """The part of the key every cell of one class shares."""
        if model.name not in self._class_keys:
            sources = [f"{path.name}:{_file_digest(path)}" for path in _class_sources(model.module, self.source_root)]
            try:
                from .tiny import tiny_config

                tiny = tiny_config(model).to_json_string(use_diff=False)
            except Exception as error:  # the config stage will fail the same way: key on the failure
                tiny = f"error: {type(error).__name__}: {error}"
            entries = []
            if self.registry is not None:
                entries = [entry.as_dict() for entry in self.registry.entries if entry.model == model.name]
                for entry in entries:
                    entry.pop("line", None)
            self._class_keys[model.name] = _digest(
                model.name, model.model_type, *sources, tiny, self._code, _versions_digest(),
                json.dumps(entries, sort_keys=True),
            )  # fmt: skip
        return self._class_keys[model.name]

    def key(self, cell) -> str:
        return _digest(self.class_key(cell.model), cell.backend, cell.shape_mode, *([self.salt] if self.salt else []))

    def _path(self, key: str) -> Path:
        return self.results / key[:2] / f"{key}.json"

    def lookup(self, cell) -> CellRecord | None:
        key = self.key(cell)
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            record = CellRecord.from_dict(read_json(path))
        except (ValueError, TypeError):
            path.unlink(missing_ok=True)  # an unreadable cache entry is just a miss
            return None
        record.reused, record.cache_key = True, key
        self.hits += 1
        return record

    def store(self, cell, record: CellRecord) -> None:
        if record.status in NOT_CACHED or record.reused:
            return
        key = self.key(cell)
        record.cache_key = key
        write_json_atomic(self._path(key), record.to_dict())

    def save_from(self, run_store, since: str) -> int:
        """Cache every record a run produced, those finished ``since`` it started (an ISO time): a resumed run's
        store also holds records of earlier invocations, made by other code than the key now names."""
        from .cells import Cell
        from .models import all_model_classes

        classes = all_model_classes()
        saved = 0
        for record in run_store.records():
            model = classes.get(record.model_class)
            fresh = not record.reused and (record.finished_at or "") >= since
            if model is not None and fresh and record.status not in NOT_CACHED:
                self.store(Cell(model, record.backend, record.shape_mode), record)
                saved += 1
        return saved


def class_weights(run: Path | None) -> dict[str, float]:
    """Seconds per class in a finished run: what shards are balanced by. Every shard of a sweep must read the same
    run, or the shards would overlap; without one, shards are balanced by class count."""
    if run is None:
        return {}
    from .store import RunStore

    weights: dict[str, float] = {}
    for record in RunStore(run).records():
        weights[record.model_class] = weights.get(record.model_class, 0.0) + (record.seconds or 0.0)
    return weights
