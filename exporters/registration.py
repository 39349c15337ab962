"""The workaround registry: the decorators that fill it, and the installer that applies a backend's patches.

A workaround is a small function registered for one backend, applied by the exporter at the stage that owns it:

- ``@register_patch(backend, *paths)``: a factory ``f(original) -> replacement``, installed only while the backend
  traces and always restored;
- ``@register_fx_node_fix(backend)``: ``f(graph_module, node) -> bool``, rewrites one FX node;
- ``@register_fx_program_fix(backend)``: ``f(exported_program) -> bool``, repairs a whole program;
- ``@register_onnx_translation(*aten_ops)``: an onnxscript function that lowers an aten op;
- ``@register_onnx_ir_fix``: ``f(onnx_ir.Model) -> bool``, rewrites the finished ONNX graph;
- ``@register_executorch_backend(name)``: ``prepare_for_<name>(model) -> partitioners``.

Every registration says what the workaround waits for (``WaitsFor``): ``upstream=`` the issue or pull request of
pytorch, executorch, onnxruntime, onnx, onnxscript or transformers whose change would make it unnecessary, or
``model_side=`` the change in the transformers modeling code that would (``"upstream change: ..."`` for a backend's
bug nobody filed), and optionally ``fixed_when="torch>=2.14"``; a registration with neither is refused at import.

Fixes return whether they changed anything, so each export records the workarounds that actually fired. A name is
registered once per backend: a second workaround of that name is refused, naming both places. The tables fill when a
backend's package is imported (``exporters.workarounds.load_registrations`` imports them all); this module imports
none of them.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import BACKENDS, PatchPathError, check_backend
from .versions import is_version_condition

BACKEND_INTERNAL_PREFIXES = (
    "torch.onnx.", "torch._export.", "torch.export.", "torch.fx.traceback.", "torch._prims_common.", "onnxscript.",
    "onnx_ir.", "executorch.",
)  # fmt: skip


def is_backend_internal(path: str) -> bool:
    return path.startswith(BACKEND_INTERNAL_PREFIXES)


# ── What a workaround waits for ───────────────────────────────────────────────

UPSTREAM_PROJECTS = ("pytorch/pytorch", "pytorch/executorch", "microsoft/onnxruntime", "onnx/onnx",
                     "microsoft/onnxscript", "huggingface/transformers")  # fmt: skip
_UPSTREAM = re.compile(r"^https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/\d+$")


@dataclass(frozen=True)
class WaitsFor:
    """The change that would make a workaround unnecessary: an upstream issue or pull request, or, where none
    exists, the change in the modeling code (or the backend) in one sentence; and the release expected to bring it."""

    upstream: str | None = None
    model_side: str | None = None
    fixed_when: str | None = None


# (backend, workaround name) -> what it waits for
WAITS_FOR: dict[tuple[str, str], WaitsFor] = {}


def waits_for(backend: str, name: str, upstream=None, model_side=None, fixed_when=None) -> WaitsFor:
    """Check what a registration says it waits for; refuse one that says nothing, naming the workaround."""
    where = f"{backend} workaround {name}"
    if upstream is None and not (isinstance(model_side, str) and model_side.strip()):
        raise ValueError(f"{where} says nothing of what would make it unnecessary: register it with "
                         "upstream='https://github.com/<project>/issues/N' or model_side='<the change that would>'")  # fmt: skip
    if upstream is not None:
        match = _UPSTREAM.match(upstream) if isinstance(upstream, str) else None
        if match is None or match.group(1) not in UPSTREAM_PROJECTS:
            raise ValueError(f"{where}: upstream {upstream!r} is not an issue or pull request of "
                             f"{', '.join(UPSTREAM_PROJECTS)}")  # fmt: skip
    if fixed_when is not None and not is_version_condition(fixed_when):
        raise ValueError(f"{where}: fixed_when {fixed_when!r} is not a version condition like 'torch>=2.14'")
    return WaitsFor(upstream, " ".join(model_side.split()) if model_side else None, fixed_when)


def _record_waits(backend: str, function: Callable, known: dict) -> None:
    WAITS_FOR[(backend, function.__name__)] = waits_for(backend, function.__name__, **known)


# ── Patches ───────────────────────────────────────────────────────────────────


@dataclass
class Patch:
    backend: str
    paths: tuple[str, ...]
    factory: Callable[[Any], Any]
    reports: bool = False  # the replacement calls report_applied() itself, when it changes something

    @property
    def name(self) -> str:
        return self.factory.__name__


PATCHES: dict[str, list[Patch]] = {backend: [] for backend in BACKENDS}
# Patches installed right now, by (patch, path): an inner export of the same backend leaves them as they are.
_INSTALLED: dict[tuple[int, str], int] = {}


def register_patch(backend: str, *paths: str, reports: bool = False, upstream: str | None = None,
                   model_side: str | None = None, fixed_when: str | None = None):  # fmt: skip
    """Register ``factory(original) -> replacement`` for every dotted path, installed while ``backend`` traces.

    A patch counts as applied when its replacement runs; with ``reports=True`` only when the replacement calls
    ``report_applied()``, for replacements that mostly hand over to the original.
    """
    check_backend(backend)
    if not paths:
        raise ValueError(f"register_patch({backend!r}) needs at least one dotted path")
    for path in paths:
        if not isinstance(path, str) or path.count(".") < 1 or not all(part.isidentifier() for part in path.split(".")):
            raise PatchPathError(f"{backend} patch: {path!r} is not a dotted path like 'torch.where'")

    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}

    def decorator(factory):
        refuse_duplicate(backend, factory)
        _record_waits(backend, factory, known)
        PATCHES[backend].append(Patch(backend, paths, factory, reports))
        return factory

    return decorator


def resolve_path(path: str) -> tuple[Any, str]:
    """Import the longest module prefix of ``path`` and walk the rest: returns ``(owner, attribute)``."""
    parts = path.split(".")
    owner, start = None, 0
    for end in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:end])
        try:
            found = module_name in sys.modules or importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            owner, start = importlib.import_module(module_name), end
            break
    if owner is None:
        raise PatchPathError(f"{path!r}: no importable module at its start")
    for part in parts[start:-1]:
        if not hasattr(owner, part):
            raise PatchPathError(f"{path!r}: {getattr(owner, '__name__', owner)!s} has no attribute {part!r}")
        owner = getattr(owner, part)
    if not hasattr(owner, parts[-1]) and not _shadows_builtin(owner, parts[-1]):
        raise PatchPathError(f"{path!r}: {getattr(owner, '__name__', owner)!s} has no attribute {parts[-1]!r}")
    return owner, parts[-1]


def _shadows_builtin(owner: Any, attribute: str) -> bool:
    """A module's builtin name (``module.len``): a patch there shadows the builtin for that module's code alone."""
    return inspect.ismodule(owner) and attribute not in vars(owner) and hasattr(builtins, attribute)


_REPORTING: contextvars.ContextVar[tuple[str, set[str]] | None] = contextvars.ContextVar("patch", default=None)


def report_applied() -> None:
    """Called by a ``reports=True`` replacement when it did change something."""
    current = _REPORTING.get()
    if current is not None:
        current[1].add(current[0])


def applied_reporter() -> Callable[[], None]:
    """`report_applied` for a replacement's later work (the class it returns): bound to the patch calling this."""
    current = _REPORTING.get()
    return (lambda: current[1].add(current[0])) if current is not None else (lambda: None)


def _counting(replacement: Any, patch: Patch, fired: set[str]) -> Any:
    if not inspect.isfunction(replacement):
        fired.add(patch.name)
        return replacement

    @functools.wraps(replacement)
    def counted(*args, **kwargs):
        if not patch.reports:
            fired.add(patch.name)
            return replacement(*args, **kwargs)
        token = _REPORTING.set((patch.name, fired))
        try:
            return replacement(*args, **kwargs)
        finally:
            _REPORTING.reset(token)

    return counted


@contextmanager
def apply_patches(
    backend: str, fired: set[str] | None = None, select: Callable[[str], bool] | None = None
) -> Iterator[None]:
    """Install every patch of ``backend`` (whose path ``select`` accepts); restore them on exit, also on error.

    ``fired`` collects the names of the patches whose replacement was called.
    """
    fired = set() if fired is None else fired
    undo: list[Callable[[], None]] = []
    if not registered_functions(check_backend(backend)):  # a caller outside the exporters (a test), too early
        raise RuntimeError(f"no {backend} workaround is registered yet: import exporters.{backend} first, or call "
                           "exporters.workarounds.load_registrations()")
    try:
        for patch in PATCHES[backend]:
            for path in patch.paths:
                key = (id(patch), path)
                if _INSTALLED.get(key) or (select is not None and not select(path)):
                    continue
                undo.append(_install(patch, path, fired))
                _INSTALLED[key] = 1
                undo.append(functools.partial(_INSTALLED.pop, key, None))
        yield
    finally:
        for step in reversed(undo):
            step()


def _install(patch: Patch, path: str, fired: set[str]) -> Callable[[], None]:
    try:
        owner, attribute = resolve_path(path)
    except PatchPathError as error:
        raise PatchPathError(f"{patch.backend} patch {patch.name}: {error}") from None
    shadowing = _shadows_builtin(owner, attribute)
    raw = None if shadowing else inspect.getattr_static(owner, attribute)
    had_own = attribute in vars(owner)
    original = getattr(builtins, attribute) if shadowing else getattr(owner, attribute)
    replacement = _counting(patch.factory(original), patch, fired)
    if isinstance(raw, staticmethod):
        replacement = staticmethod(replacement)
    elif isinstance(raw, classmethod):
        replacement = classmethod(replacement)
    try:
        setattr(owner, attribute, replacement)
    except (TypeError, AttributeError) as error:
        raise PatchPathError(f"{patch.backend} patch {patch.name}: cannot set {path!r}: {error}") from None

    def restore():
        if had_own:
            setattr(owner, attribute, raw)
        else:
            delattr(owner, attribute)

    return restore


# ── FX fixes ──────────────────────────────────────────────────────────────────

FX_NODE_FIXES: dict[str, list[Callable]] = {backend: [] for backend in BACKENDS}
FX_PROGRAM_FIXES: dict[str, list[Callable]] = {backend: [] for backend in BACKENDS}


def _fx_fix_registrar(table: dict[str, list[Callable]], backend: str, known: dict[str, str | None]):
    check_backend(backend)

    def decorator(fix):
        refuse_duplicate(backend, fix)
        _record_waits(backend, fix, known)
        table[backend].append(fix)
        return fix

    return decorator


def register_fx_node_fix(backend: str, upstream: str | None = None, model_side: str | None = None,
                         fixed_when: str | None = None):  # fmt: skip
    """Register ``fix(graph_module, node) -> bool``: rewrite one node, return whether the graph changed."""
    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}
    return _fx_fix_registrar(FX_NODE_FIXES, backend, known)


def register_fx_program_fix(backend: str, upstream: str | None = None, model_side: str | None = None,
                            fixed_when: str | None = None):  # fmt: skip
    """Register ``fix(exported_program) -> bool``: repair a whole program, return whether it changed."""
    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}
    return _fx_fix_registrar(FX_PROGRAM_FIXES, backend, known)


def apply_fx_node_fixes(backend: str, graph_module, applied: list[str] | None = None) -> list[str]:
    """Run every node fix of ``backend`` over every node; returns the names of the fixes that changed something."""
    fixes = FX_NODE_FIXES[check_backend(backend)]
    changed: list[str] = []
    for node in list(graph_module.graph.nodes):
        for fix in fixes:
            if fix(graph_module, node):
                if fix.__name__ not in changed:
                    changed.append(fix.__name__)
                break  # the node may be gone
    if changed:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    if applied is not None:
        applied.extend(name for name in changed if name not in applied)
    return changed


def apply_fx_program_fixes(backend: str, exported_program, applied: list[str] | None = None) -> list[str]:
    changed = [fix.__name__ for fix in FX_PROGRAM_FIXES[check_backend(backend)] if fix(exported_program)]
    if applied is not None:
        applied.extend(name for name in changed if name not in applied)
    return changed


# ── ONNX translations and IR fixes, ExecuTorch backends ───────────────────────

ONNX_TRANSLATIONS: dict[Any, Callable] = {}
ONNX_IR_FIXES: list[Callable] = []
EXECUTORCH_BACKENDS: dict[str, Callable] = {}


def register_onnx_translation(*aten_ops, upstream: str | None = None, model_side: str | None = None,
                              fixed_when: str | None = None):  # fmt: skip
    """Register an onnxscript function as the lowering of each aten overload in ``aten_ops``."""
    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}

    def decorator(function):
        refuse_duplicate("onnx", function)
        _record_waits("onnx", function, known)
        for op in aten_ops:
            ONNX_TRANSLATIONS[op] = function
        return function

    return decorator


def register_onnx_ir_fix(upstream: str | None = None, model_side: str | None = None, fixed_when: str | None = None):
    """Register ``fix(onnx_ir.Model) -> bool``, run on every finished ONNX graph."""
    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}

    def decorator(fix):
        refuse_duplicate("onnx", fix)
        _record_waits("onnx", fix, known)
        ONNX_IR_FIXES.append(fix)
        return fix

    return decorator


def register_executorch_backend(name: str, upstream: str | None = None, model_side: str | None = None,
                                fixed_when: str | None = None):  # fmt: skip
    """Register ``prepare_for_<name>(model) -> list of partitioners`` as ExecuTorch backend ``name``."""
    known = {"upstream": upstream, "model_side": model_side, "fixed_when": fixed_when}

    def decorator(prepare):
        refuse_duplicate("executorch", prepare)
        _record_waits("executorch", prepare, known)
        EXECUTORCH_BACKENDS[name] = prepare
        return prepare

    return decorator


# ── Switches: workarounds that are no registered function ─────────────────────

# backend -> name -> (what it does, the stage that applies it): they appear in a record's `applied` like the others
SWITCHES: dict[str, dict[str, tuple[str, str]]] = {backend: {} for backend in BACKENDS}


def register_switch(backend: str, name: str, description: str, stage: str, upstream: str | None = None,
                    model_side: str | None = None, fixed_when: str | None = None) -> str:  # fmt: skip
    """Declare a switch the exporter flips for the trace (not a function one can unregister); returns its name."""
    check_backend(backend)
    WAITS_FOR[(backend, name)] = waits_for(backend, name, upstream, model_side, fixed_when)
    SWITCHES[backend][name] = (description, stage)
    return name


# ── One name, one workaround ──────────────────────────────────────────────────


def _place(function: Callable) -> str:
    code = getattr(inspect.unwrap(function), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else getattr(function, "__module__", "?")


def registered_functions(backend: str) -> list[Callable]:
    """Every function registered for ``backend`` right now, of every kind."""
    functions = [patch.factory for patch in PATCHES[backend]] + FX_PROGRAM_FIXES[backend] + FX_NODE_FIXES[backend]
    if backend == "onnx":
        functions += [*ONNX_TRANSLATIONS.values(), *ONNX_IR_FIXES]
    if backend == "executorch":
        functions += list(EXECUTORCH_BACKENDS.values())
    return functions


def refuse_duplicate(backend: str, function: Callable) -> None:
    """A workaround's name is its key (``applied``, ``disabled_workarounds``): one name, one workaround per backend."""
    for other in registered_functions(backend):
        if other.__name__ == function.__name__ and other is not function:
            raise ValueError(
                f"{backend} workaround {function.__name__} is registered twice: at {_place(other)} and at "
                f"{_place(function)}; rename one"
            )
        if other is function and function not in ONNX_TRANSLATIONS.values():
            raise ValueError(f"{backend} workaround {function.__name__} ({_place(function)}) is registered twice")
