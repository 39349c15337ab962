"""Every backend's workarounds, loaded: the listing, turning some off, checking and importing what patches target.

Each function here but ``import_patch_targets`` first imports the backends' packages (``load_registrations``), whose
decorators fill the tables of :mod:`exporters.registration`: a caller outside the exporters (a test, the harness)
needs no import of its own. ``import_patch_targets`` serves the backends already imported, and only those.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .backends import package
from .errors import BACKENDS, PatchPathError, check_backend
from .registration import (
    EXECUTORCH_BACKENDS,
    FX_NODE_FIXES,
    FX_PROGRAM_FIXES,
    ONNX_IR_FIXES,
    ONNX_TRANSLATIONS,
    PATCHES,
    Patch,
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

