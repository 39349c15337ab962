"""Incremental sweeps: a cell's record is reused while nothing it depends on has changed, and a change re-runs only
the cells it can touch.

What a cell depends on, each part kept with its cached record so a miss can say why:

- versions: transformers, torch, onnx, onnxscript, onnxruntime, executorch (a slot of the cache each);
- class: its modeling file and the configuration files beside it (its tiny config follows from those and harness);
- harness: the files that build inputs and run stages (cells, inputs, tiny, tables, records);
- pipeline: the exporter code every cell of its backend runs, workarounds aside (``harness.code_index``);
- workarounds: each workaround that could touch it (those of its backend chain that are generic, those written for a
  model family its model is built from) and each it applied, by its own digest;
- registry: the entries naming its class; and what else the run changed (workarounds turned off).

So editing one model's patch re-runs that family's cells, a generic ExecuTorch fix the ExecuTorch cells, and a
README, test, report or command-line change nothing. Keys are computed from files alone: no model is built and no
torch imported to know a cell is unchanged. Timeouts, crashes and memory blow-ups are not cached: they depend on the
machine as much as on the code.
"""

from __future__ import annotations

import ast
import json
import os
from functools import cache
from pathlib import Path

from .code_index import CodeIndex, digest
from .records import CellRecord
from .store import read_json, write_json_atomic

NOT_CACHED = ("timeout", "crash", "oom")
_ROOT = Path(__file__).resolve().parent.parent
# The harness files a cell's result depends on (the rest, like progress lines and reports, do not change results).
_HARNESS_FILES = ("cells.py", "inputs.py", "tiny.py", "tables.py", "records.py")
_STATIC_PARTS = ("class", "harness", "pipeline", "registry", "salt")


def default_cache_dir() -> Path:
    root = os.environ.get("EXPORT_SWEEP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "export-sweep")
    return Path(root)


def _file_digest(path: Path) -> str:
    try:
        return digest(path.read_bytes())
    except OSError:
        return "missing"


@cache
def versions_digest() -> str:
    from exporters.versions import package_versions

    return digest(json.dumps(package_versions(), sort_keys=True))


def transformers_root() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("transformers").origin).parent


def _class_sources(module: str, root: Path) -> list[Path]:
    """The modeling file that defines the class and the configuration file(s) beside it."""
    if not module:
        return []
    modeling = root.joinpath(*module.split(".")).with_suffix(".py")
    return [modeling, *sorted(modeling.parent.glob("configuration_*.py"))]


def static_modules(module: str, root: Path) -> list[str]:
    """The transformers modeling modules a class' own module imports from other model folders (a record made before
    cells recorded the modules their model is built from falls back on these)."""
    own = f"transformers.{module}"
    path = root.joinpath(*module.split(".")).with_suffix(".py")
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return [own]
    package = own.rsplit(".", 1)[0].split(".")
    found = {own}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and node.module:
            base = package[: len(package) - node.level + 1]
            name = ".".join([*base, node.module])
            if name.startswith("transformers.models.") and ".modeling_" in name:
                found.add(name)
    return sorted(found)


class ResultCache:
    """The last result of each cell, per versions, with the parts of the key it was made under.

    ``code_root`` (our package) and ``source_root`` (transformers) are where the hashed files are read."""

    def __init__(self, directory: Path | None = None, registry=None, code_root: Path = _ROOT,
                 source_root: Path | None = None, salt: str = ""):  # fmt: skip
        self.directory = Path(directory) if directory else default_cache_dir()
        self.results = self.directory / "results" / versions_digest()[:16]
        self.registry = registry
        self.source_root = source_root or transformers_root()
        self.index = CodeIndex.read(code_root)
        self.harness = digest(*(_file_digest(Path(code_root) / "harness" / name) for name in _HARNESS_FILES))
        self.salt = salt  # what else changes results (workarounds turned off for the run)
        self._classes: dict[str, str] = {}
        self._registries: dict[str, str] = {}
        self._modules: dict[str, list[str]] = {}
        self.hits = 0

    def _class_digest(self, model) -> str:
        if model.name not in self._classes:
            sources = [f"{path.name}:{_file_digest(path)}" for path in _class_sources(model.module, self.source_root)]
            self._classes[model.name] = digest(model.name, model.model_type, *sources)
        return self._classes[model.name]

    def _registry_digest(self, model) -> str:
        if model.name not in self._registries:
            entries = []
            if self.registry is not None:
                entries = [entry.as_dict() for entry in self.registry.entries if entry.model == model.name]
                for entry in entries:
                    entry.pop("line", None)
            self._registries[model.name] = digest(json.dumps(entries, sort_keys=True))
        return self._registries[model.name]

    def parts(self, cell, modules=None, applied=()) -> dict:
        """What the cell's result depends on now, given the modules its model is built from and what it applied."""
        if not modules:
            if cell.model.module not in self._modules:
                self._modules[cell.model.module] = static_modules(cell.model.module, self.source_root)
            modules = self._modules[cell.model.module]
        return {
            "class": self._class_digest(cell.model), "harness": self.harness,
            "pipeline": self.index.pipeline(cell.backend), "registry": self._registry_digest(cell.model),
            "salt": self.salt, "workarounds": self.index.relevant(cell.backend, modules, applied),
        }  # fmt: skip

    def key(self, cell) -> str:
        """The cell's key as it stands before it has run (no record yet to say what it applied)."""
        return digest(cell.backend, cell.shape_mode, json.dumps(self.parts(cell), sort_keys=True))

    def _path(self, cell) -> Path:
        return self.results / f"{cell.id}.json"

    def _entry(self, cell) -> tuple[CellRecord, dict] | None:
        path = self._path(cell)
        if not path.is_file():
            return None
        try:
            data = read_json(path)
            return CellRecord.from_dict(data["record"]), data["parts"]
        except (ValueError, TypeError, KeyError):
            path.unlink(missing_ok=True)  # an unreadable cache entry is just a miss
            return None

    def explain(self, cell) -> tuple[CellRecord | None, str | None]:
        """``(the cached record, None)`` when it still holds, else ``(None, why it does not)``."""
        entry = self._entry(cell)
        if entry is None:
            return None, "not run before with these versions"
        record, stored = entry
        now = self.parts(cell, record.modules, record.applied)
        for part in _STATIC_PARTS:
            if stored.get(part) != now[part]:
                return None, {"class": "its model's source changed", "harness": "the harness changed",
                              "pipeline": f"the {cell.backend} exporter changed", "registry": "its registry entries changed",
                              "salt": "other workarounds turned off"}[part]  # fmt: skip
        before, after = stored.get("workarounds", {}), now["workarounds"]
        changed = sorted(name for name in before.keys() & after.keys() if before[name] != after[name])
        added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
        for what, names in (("workaround changed", changed), ("workaround added", added), ("workaround removed", removed)):
            if names:
                return None, f"{what}: {names[0].split(':', 1)[1]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")
        return record, None

    def lookup(self, cell) -> CellRecord | None:
        record, _why = self.explain(cell)
        if record is None:
            return None
        record.reused = True  # its stored cache_key is the one it was made under, and explain() found it unchanged
        self.hits += 1
        return record

    def store(self, cell, record: CellRecord) -> None:
        if record.status in NOT_CACHED or record.reused:
            return
        parts = self.parts(cell, record.modules, record.applied)
        record.cache_key = digest(cell.backend, cell.shape_mode, json.dumps(parts, sort_keys=True))
        write_json_atomic(self._path(cell), {"parts": parts, "record": record.to_dict()})

    # ── the workaround listing, for a run whose every cell was cached (no exporter imported) ──
    def _listing_path(self) -> Path:
        return self.directory / "listings" / f"{digest(json.dumps(self.index.fingerprint()))[:24]}.json"

    def keep_listing(self, run_dir: Path) -> None:
        from .ledger import WORKAROUNDS_FILE

        source = Path(run_dir) / WORKAROUNDS_FILE
        if source.is_file():
            write_json_atomic(self._listing_path(), read_json(source))

    def copy_listing(self, run_dir: Path) -> bool:
        from .ledger import WORKAROUNDS_FILE

        if not self._listing_path().is_file():
            return False
        write_json_atomic(Path(run_dir) / WORKAROUNDS_FILE, read_json(self._listing_path()))
        return True

    def save_from(self, run_store, since: str) -> int:
        """Cache every record a run produced, those finished ``since`` it started (an ISO time): a resumed run's
        store also holds records of earlier invocations, made by other code than the key now names."""
        from .cells import Cell
        from .models import all_model_classes

        classes = all_model_classes()
        saved = 0
        self.keep_listing(run_store.directory)
        for record in run_store.records():
            model = classes.get(record.model_class)
            fresh = not record.reused and (record.finished_at or "") >= since
            if model is not None and fresh and record.status not in NOT_CACHED:
                self.store(Cell(model, record.backend, record.shape_mode, record.dtype), record)
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
