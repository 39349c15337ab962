"""The stages of one export: each timed, and any exception in it turned into the backend's ``ExportError`` naming
it, with torch.onnx's errors led by their cause. ``watching_stages`` tells an outside watcher which stage runs."""

from __future__ import annotations

import contextvars
import re
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .errors import ExportError


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
