"""The workaround registry and the helpers every exporter shares.

A workaround is a small function registered for one backend, applied by the exporter at the stage that owns it:

- ``@register_patch(backend, *paths)``: a factory ``f(original) -> replacement``, installed only while the backend
  traces and always restored;
- ``@register_fx_node_fix(backend)``: ``f(graph_module, node) -> bool``, rewrites one FX node;
- ``@register_fx_program_fix(backend)``: ``f(exported_program) -> bool``, repairs a whole program;
- ``@register_onnx_translation(*aten_ops)``: an onnxscript function that lowers an aten op;
- ``@register_onnx_ir_fix``: ``f(onnx_ir.Model) -> bool``, rewrites the finished ONNX graph;
- ``@register_executorch_backend(name)``: ``prepare_for_<name>(model) -> partitioners``.

Fixes return whether they changed anything, so each export records the workarounds that actually fired.
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
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

BACKENDS = ("dynamo", "onnx", "executorch")


# Patches on these are exporter internals: installed for the conversion, not for the model's trace.
BACKEND_INTERNAL_PREFIXES = (
    "torch.onnx.", "torch._export.", "torch.export.", "torch.fx.traceback.", "torch._prims_common.", "onnxscript.",
    "onnx_ir.", "executorch.",
)  # fmt: skip


def is_backend_internal(path: str) -> bool:
    return path.startswith(BACKEND_INTERNAL_PREFIXES)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return backend


# ── Errors that name their stage ──────────────────────────────────────────────


class ExportError(RuntimeError):
    """An export failed at ``stage``; ``stages`` holds the timing of every stage up to and including it."""

    backend = "export"

    def __init__(self, stage: str, message: str, *, stages: list[dict] | None = None, applied: list[str] | None = None):
        super().__init__(f"[{self.backend}:{stage}] {message}")
        self.stage = stage
        self.message = message
        self.stages = stages or []
        self.applied = applied or []


class DynamoExportError(ExportError):
    backend = "dynamo"


class OnnxExportError(ExportError):
    backend = "onnx"


class ExecutorchExportError(ExportError):
    backend = "executorch"


class PatchPathError(LookupError):
    """A registered patch names a path that does not resolve."""


_STAGE_WATCHER: contextvars.ContextVar[Callable[[str | None, list[dict]], None] | None] = contextvars.ContextVar(
    "stage_watcher", default=None
)


@contextmanager
def watching_stages(watcher: Callable[[str | None, list[dict]], None]) -> Iterator[None]:
    """Calls ``watcher(open_stage, ended_stages)`` whenever an export stage starts or ends (``open_stage`` the
    innermost still running, None between stages): whoever kills a hung export can still say where it hung."""
    token = _STAGE_WATCHER.set(watcher)
    try:
        yield
    finally:
        _STAGE_WATCHER.reset(token)


class StageLog:
    """Times the stages of one export and turns any exception into the backend's ``ExportError`` for that stage.

    Stages may nest (a hook inside ``torch.onnx.export`` opens its own): each is recorded when it ends, so an inner
    stage comes first, and an outer stage's seconds exclude its inner stages'.
    """

    def __init__(self, error_class: type[ExportError]):
        self.error_class = error_class
        self.stages: list[dict] = []
        self.applied: list[str] = []
        self._inner_seconds: list[float] = []
        self._open: list[str] = []
        self._watcher = _STAGE_WATCHER.get()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._inner_seconds.append(0.0)
        self._open.append(name)
        self._tell_watcher()
        status = "fail"
        try:
            yield
            status = "pass"
        except ExportError as error:
            if isinstance(error, self.error_class):
                raise
            raise self._wrap(name, error) from error
        except Exception as error:
            raise self._wrap(name, error) from error
        finally:
            elapsed = time.perf_counter() - start
            inner = self._inner_seconds.pop()
            if self._inner_seconds:
                self._inner_seconds[-1] += elapsed
            self.stages.append({"name": name, "status": status, "seconds": round(elapsed - inner, 4)})
            self._open.pop()
            self._tell_watcher()

    def _tell_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher(self._open[-1] if self._open else None, list(self.stages))

    def note(self, names) -> None:
        for name in names:
            if name not in self.applied:
                self.applied.append(name)

    def _wrap(self, name: str, error: BaseException) -> ExportError:
        # A stage failing inside a library call (a hook in torch.onnx) comes back wrapped by that library: keep the
        # innermost stage, it is the one that failed.
        inner = _cause_chain(error)
        if inner is not None:
            name, error = inner.stage, inner.__cause__ or inner
        message = f"{type(error).__name__}: {_readable(str(error))}"
        wrapped = self.error_class(name, message, stages=self.stages, applied=self.applied)
        wrapped.cause_type = type(error).__name__
        wrapped.cause_traceback = "".join(traceback.format_exception(error))
        return wrapped


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SUMMARY_CAUSE = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>: (.*)$", re.MULTILINE)


def _readable(text: str) -> str:
    """torch.onnx leads its errors with the same advice every time ("This is step 3/3 ...") and puts the cause
    under "## Exception summary": the innermost cause comes first instead, the rest follows unchanged."""
    text = _ANSI.sub("", text)
    _, found, summary = text.partition("## Exception summary")
    causes = _SUMMARY_CAUSE.findall(summary) if found else []
    if not causes:
        return text
    kind, reason = causes[0]
    return f"{kind}: {reason}\n\n{text}"


def _cause_chain(error: BaseException) -> ExportError | None:
    seen = set()
    error = error.__cause__ or error.__context__
    while error is not None and id(error) not in seen:
        if isinstance(error, ExportError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


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


_PATCHES: dict[str, list[Patch]] = {backend: [] for backend in BACKENDS}
# Patches installed right now, by (patch, path): an inner export of the same backend leaves them as they are.
_INSTALLED: dict[tuple[int, str], int] = {}


def register_patch(backend: str, *paths: str, reports: bool = False):
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

    def decorator(factory):
        _PATCHES[backend].append(Patch(backend, paths, factory, reports))
        return factory

    return decorator


def load_registrations(*backends: str) -> None:
    """Import the exporter modules (of ``backends``, or all), whose decorators fill the registry (the package
    imports them lazily). Each backend's workarounds live in its own module."""
    for backend in backends or BACKENDS:
        importlib.import_module(f"{__package__}.exporter_{check_backend(backend)}")


def registered_patches(backend: str) -> list[Patch]:
    load_registrations()
    return list(_PATCHES[check_backend(backend)])


def import_patch_targets() -> None:
    """Import the modules every registered patch installs into, without installing anything: a process that forks
    one child per model class does it once, instead of every child's first export (about a thousand modules). A path
    that fails here is left for the export that installs it to report, in its own stage."""
    for patches in _PATCHES.values():
        for patch in patches:
            for path in patch.paths:
                try:
                    resolve_path(path)
                except Exception:  # any import error is the export's to report
                    pass


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
    load_registrations(backend)  # a caller outside the exporters (a test) may come before its module is imported
    try:
        for patch in _PATCHES[check_backend(backend)]:
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


def check_patch_paths(backend: str | None = None) -> list[str]:
    """Every registered path that does not resolve, as readable lines (empty when all resolve)."""
    load_registrations()
    problems = []
    for name in [backend] if backend else BACKENDS:
        for patch in _PATCHES[check_backend(name)]:
            for path in patch.paths:
                try:
                    resolve_path(path)
                except (PatchPathError, ImportError) as error:
                    problems.append(f"{name} patch {patch.name}: {error}")
    return problems


# ── FX fixes ──────────────────────────────────────────────────────────────────

_FX_NODE_FIXES: dict[str, list[Callable]] = {backend: [] for backend in BACKENDS}
_FX_PROGRAM_FIXES: dict[str, list[Callable]] = {backend: [] for backend in BACKENDS}


def register_fx_node_fix(backend: str):
    """Register ``fix(graph_module, node) -> bool``: rewrite one node, return whether the graph changed."""
    check_backend(backend)

    def decorator(fix):
        _FX_NODE_FIXES[backend].append(fix)
        return fix

    return decorator


def contiguous_copy(graph, source):
    """A node copying ``source`` into contiguous memory, with its fake value; call it under ``graph.inserting_*``."""
    import torch

    copy = graph.call_function(torch.ops.aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = source.meta["val"].clone(memory_format=torch.contiguous_format)
    return copy


def register_fx_program_fix(backend: str):
    """Register ``fix(exported_program) -> bool``: repair a whole program, return whether it changed."""
    check_backend(backend)

    def decorator(fix):
        _FX_PROGRAM_FIXES[backend].append(fix)
        return fix

    return decorator


def apply_fx_node_fixes(backend: str, graph_module, applied: list[str] | None = None) -> list[str]:
    """Run every node fix of ``backend`` over every node; returns the names of the fixes that changed something."""
    fixes = _FX_NODE_FIXES[check_backend(backend)]
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
    changed = [fix.__name__ for fix in _FX_PROGRAM_FIXES[check_backend(backend)] if fix(exported_program)]
    if applied is not None:
        applied.extend(name for name in changed if name not in applied)
    return changed


def without_autograd_for_scans(exported_program):
    """`no_grad` around lowering a program that holds a `scan`: with autograd on, torch decomposes a scan to its
    training form, which returns the sizes it saves for backward among its outputs, and the lowering fails
    ("'SymInt' object has no attribute 'unsqueeze'"). Other programs lower as they always have."""
    import contextlib

    import torch

    scans = (node for module in exported_program.graph_module.modules() if isinstance(module, torch.fx.GraphModule)
             for node in module.graph.nodes if node.target is torch.ops.higher_order.scan)  # fmt: skip
    return torch.no_grad() if next(scans, None) is not None else contextlib.nullcontext()


# ── ONNX translations and IR fixes, ExecuTorch backends ───────────────────────

ONNX_TRANSLATIONS: dict[Any, Callable] = {}
ONNX_IR_FIXES: list[Callable] = []
EXECUTORCH_BACKENDS: dict[str, Callable] = {}


def register_onnx_translation(*aten_ops):
    """Register an onnxscript function as the lowering of each aten overload in ``aten_ops``."""

    def decorator(function):
        for op in aten_ops:
            ONNX_TRANSLATIONS[op] = function
        return function

    return decorator


def register_onnx_ir_fix(fix):
    """Register ``fix(onnx_ir.Model) -> bool``, run on every finished ONNX graph."""
    ONNX_IR_FIXES.append(fix)
    return fix


def register_executorch_backend(name: str):
    """Register ``prepare_for_<name>(model) -> list of partitioners`` as ExecuTorch backend ``name``."""

    def decorator(prepare):
        EXECUTORCH_BACKENDS[name] = prepare
        return prepare

    return decorator


def workarounds(backend: str) -> dict[str, list[str]]:
    """Every registered workaround of ``backend`` by kind, with the first line of its docstring."""

    load_registrations()

    def describe(function) -> str:
        doc = (function.__doc__ or "").strip().splitlines()
        return f"{function.__name__}: {doc[0]}" if doc else function.__name__

    check_backend(backend)
    listing = {
        "patches": [describe(patch.factory) for patch in _PATCHES[backend]],
        "fx_program_fixes": [describe(fix) for fix in _FX_PROGRAM_FIXES[backend]],
        "fx_node_fixes": [describe(fix) for fix in _FX_NODE_FIXES[backend]],
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
    tables: list[list] = [*_PATCHES.values(), *_FX_NODE_FIXES.values(), *_FX_PROGRAM_FIXES.values(), ONNX_IR_FIXES]

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


# ── Named leaves: inputs and outputs by name ──────────────────────────────────


def key_path_name(path) -> str:
    """``(MappingKey('past_key_values'), GetAttrKey('layers.0.keys'))`` -> ``'past_key_values.layers.0.keys'``."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts) or "output"  # a bare tensor, not inside any container


def named_leaves(tree: Any) -> dict[str, Any]:
    """Every tensor leaf of ``tree`` (a ModelOutput, a Cache, nested tuples...) by its dotted path."""
    import torch
    from torch.utils import _pytree

    leaves, _ = _pytree.tree_flatten_with_path(tree)
    return {key_path_name(path): leaf for path, leaf in leaves if isinstance(leaf, torch.Tensor)}


def spec_leaf_names(spec) -> list[str]:
    """The dotted names of the leaves of a pytree spec, in flattening order."""
    import torch
    from torch.utils import _pytree

    # Markers are tensors, so every node type (caches included) keeps them as leaves when flattened again.
    markers = [torch.empty(0) for _ in range(spec.num_leaves)]
    leaves, _ = _pytree.tree_flatten_with_path(_pytree.tree_unflatten(markers, spec))
    names = {id(leaf): key_path_name(path) for path, leaf in leaves}
    return [names[id(marker)] for marker in markers]


# Inputs whose values a model reads as sizes: the per-image geometry it crops, tiles and loops by (LLaVA-NeXT's
# any-resolution grid, Pixtral's crops, Qwen-VL's patch grids, how many of the grids each sample owns in GLM-Image,
# VideoLLaMA 3's per-image merge factors), and the audio frames the Qwen audio towers chunk by
# (``feature_attention_mask``, a per-sample count of real frames).
# Traced, their values become data-dependent sizes that export cannot guard on nor ExecuTorch plan memory for. A
# static export fixes every shape, so it bakes these in too: the geometry is part of the program, and calling it
# with another one is refused.
SIZE_INPUTS = ("image_sizes", "image_grid_thw", "video_grid_thw", "grid_thw", "image_grid_hw", "spatial_shapes",
               "target_sizes", "feature_attention_mask", "images_per_sample", "merge_sizes",
               "image_merge_sizes", "video_merge_sizes")


def constant_value(name: str, value: Any) -> Any:
    """``value`` as a constant baked into a program: a size input's tensor as nested lists of ints."""
    import torch

    return value.tolist() if name in SIZE_INPUTS and isinstance(value, torch.Tensor) else value


def split_inputs(inputs: dict[str, Any], sizes_as_constants: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword inputs into traced ones (anything holding a tensor) and constants baked into the program; with
    ``sizes_as_constants`` (a static export), the ``SIZE_INPUTS`` are constants too."""
    import torch
    from torch.utils import _pytree

    traced, constants = {}, {}
    for name, value in inputs.items():
        if sizes_as_constants:
            value = constant_value(name, value)
        if any(isinstance(leaf, torch.Tensor) for leaf in _pytree.tree_leaves(value)):
            traced[name] = value
        else:
            constants[name] = value
    return traced, constants
