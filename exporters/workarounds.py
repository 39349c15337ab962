"""Every backend's workarounds, loaded: the listing, turning some off, checking and importing what patches target.

Each function here but ``import_patch_targets`` first imports the backends' packages (``load_registrations``), whose
decorators fill the tables of :mod:`exporters.registration`: a caller outside the exporters (a test, the harness)
needs no import of its own. ``import_patch_targets`` serves the backends already imported, and only those.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .backends import package
from .errors import BACKENDS, PatchPathError, check_backend
from .registration import (
    EXECUTORCH_BACKENDS,
    FX_NODE_FIXES,
    FX_PROGRAM_FIXES,
    ONNX_IR_FIXES,
    ONNX_TRANSLATIONS,
    PATCHES,
    SWITCHES,
    WAITS_FOR,
    Patch,
    WaitsFor,
    is_backend_internal,
    resolve_path,
)


def load_registrations(*backends: str) -> None:
    """Import the packages of ``backends`` (or of all), whose workaround files fill the registry when imported."""
    for backend in backends or BACKENDS:
        package(backend)


def registered_patches(backend: str) -> list[Patch]:
    load_registrations()
    return list(PATCHES[check_backend(backend)])


def import_patch_targets() -> None:
    """Import the modules every registered patch installs into, without installing anything: a process that forks
    one child per model class does it once, instead of every child's first export (about a thousand modules). A path
    that fails here is left for the export that installs it to report, in its own stage."""
    for patches in PATCHES.values():
        for patch in patches:
            for path in patch.paths:
                try:
                    resolve_path(path)
                except Exception:  # any import error is the export's to report
                    pass


def check_patch_paths(backend: str | None = None) -> list[str]:
    """Every registered path that does not resolve, as readable lines (empty when all resolve)."""
    load_registrations()
    problems = []
    for name in [backend] if backend else BACKENDS:
        for patch in PATCHES[check_backend(name)]:
            for path in patch.paths:
                try:
                    resolve_path(path)
                except (PatchPathError, ImportError) as error:
                    problems.append(f"{name} patch {patch.name}: {error}")
    return problems


def workarounds(backend: str) -> dict[str, list[str]]:
    """Every registered workaround of ``backend`` by kind, with the first line of its docstring."""

    load_registrations()

    def describe(function) -> str:
        doc = (function.__doc__ or "").strip().splitlines()
        return f"{function.__name__}: {doc[0]}" if doc else function.__name__

    check_backend(backend)
    listing = {
        "patches": [describe(patch.factory) for patch in PATCHES[backend]],
        "fx_program_fixes": [describe(fix) for fix in FX_PROGRAM_FIXES[backend]],
        "fx_node_fixes": [describe(fix) for fix in FX_NODE_FIXES[backend]],
    }
    if backend == "onnx":
        listing["translations"] = sorted({describe(function) for function in ONNX_TRANSLATIONS.values()})
        listing["ir_fixes"] = [describe(fix) for fix in ONNX_IR_FIXES]
    if backend == "executorch":
        listing["backends"] = [describe(prepare) for prepare in EXECUTORCH_BACKENDS.values()]
    return listing


@contextmanager
def disabled_workarounds(*names: str) -> Iterator[None]:
    """Unregister the named workarounds inside the block: shows whether a model still needs them."""
    load_registrations()
    tables: list[list] = [*PATCHES.values(), *FX_NODE_FIXES.values(), *FX_PROGRAM_FIXES.values(), ONNX_IR_FIXES]

    def name_of(entry) -> str:
        return entry.name if isinstance(entry, Patch) else entry.__name__

    known = {name_of(entry) for table in tables for entry in table} | {f.__name__ for f in ONNX_TRANSLATIONS.values()}
    unknown = sorted(set(names) - known)
    if unknown:
        raise KeyError(f"no registered workaround named {', '.join(unknown)}")
    saved_tables = [(table, list(table)) for table in tables]
    saved_translations = dict(ONNX_TRANSLATIONS)
    for table in tables:
        table[:] = [entry for entry in table if name_of(entry) not in names]
    for op, function in saved_translations.items():
        if function.__name__ in names:
            del ONNX_TRANSLATIONS[op]
    try:
        yield
    finally:
        for table, entries in saved_tables:
            table[:] = entries
        ONNX_TRANSLATIONS.clear()
        ONNX_TRANSLATIONS.update(saved_translations)



# ── The ledger: every workaround with what it waits for ───────────────────────

_REPOSITORY = Path(__file__).resolve().parent.parent  # places are named from here: exporters/onnx/workarounds.py:40
# The stage that applies each kind of workaround (a patch: where it is installed)
_STAGE_OF_KIND = {"fx_program_fixes": "fx-program-fixes", "fx_node_fixes": "fx-node-fixes",
                  "translations": "onnx-translation", "ir_fixes": "ir-fixes", "backends": "backend-preparation"}  # fmt: skip


def ledger(backends=BACKENDS) -> list[dict]:
    """One row per workaround of ``backends``: name, backend, kind, stage, targets, the first line of its docstring,
    where it is written, and what it waits for (upstream, model_side, fixed_when)."""
    load_registrations(*backends)
    rows = []

    def add(backend: str, kind: str, function, stage: str, targets=()):
        doc = (function.__doc__ or "").strip().splitlines()
        code = getattr(inspect.unwrap(function), "__code__", None)
        place = f"{os.path.relpath(code.co_filename, _REPOSITORY)}:{code.co_firstlineno}" if code else ""
        rows.append(_row(backend, function.__name__, kind, stage, list(targets), doc[0] if doc else "", place))

    for backend in backends:
        for patch in PATCHES[backend]:
            internal = any(is_backend_internal(path) for path in patch.paths)
            stage = "model-patches" if backend == "dynamo" else f"{backend}-patches" if internal else "torch-patches"
            add(backend, "patch", patch.factory, stage, patch.paths)
        for fix in FX_PROGRAM_FIXES[backend]:
            add(backend, "fx_program_fix", fix, _STAGE_OF_KIND["fx_program_fixes"])
        for fix in FX_NODE_FIXES[backend]:
            add(backend, "fx_node_fix", fix, _STAGE_OF_KIND["fx_node_fixes"])
        for name, (description, stage) in SWITCHES[backend].items():
            rows.append(_row(backend, name, "switch", stage, [], description, ""))
    if "onnx" in backends:
        _onnx_rows(add)
    if "executorch" in backends:
        for name, prepare in EXECUTORCH_BACKENDS.items():
            add("executorch", "backend_preparation", prepare, _STAGE_OF_KIND["backends"], [name])
    return rows


def _onnx_rows(add) -> None:
    ops: dict[str, list[str]] = {}
    for op, function in ONNX_TRANSLATIONS.items():
        ops.setdefault(function.__name__, []).append(str(op))
    for function in {id(f): f for f in ONNX_TRANSLATIONS.values()}.values():
        add("onnx", "translation", function, _STAGE_OF_KIND["translations"], ops[function.__name__])
    for fix in ONNX_IR_FIXES:
        add("onnx", "ir_fix", fix, _STAGE_OF_KIND["ir_fixes"])


def _row(backend, name, kind, stage, targets, summary, place) -> dict:
    waits = WAITS_FOR.get((backend, name), WaitsFor())
    return {"name": name, "backend": backend, "kind": kind, "stage": stage, "targets": targets, "summary": summary,
            "place": place, "upstream": waits.upstream, "model_side": waits.model_side, "fixed_when": waits.fixed_when}  # fmt: skip
