"""The backends' names, and the errors an export raises: each names its backend and the stage that failed.

Nothing here imports torch: the harness, the registry and the reports read ``BACKENDS`` cheaply.
"""

from __future__ import annotations

BACKENDS = ("dynamo", "onnx", "executorch")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return backend


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
