"""The backends by name: each one's package, exporter, config and artifact, and ``load()`` of a saved export.

The one place that maps a backend to its code. Reading ``BACKENDS`` imports nothing heavy (no torch); a backend's
package is imported when it is asked for, and only that one: loading a ``.onnx`` export imports ``exporters.onnx``
(and the Dynamo package it traces through), never ``exporters.executorch``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from .errors import BACKENDS, check_backend
from .exported import METADATA_FILE, Exported


def _dynamo() -> ModuleType:
    from . import dynamo

    return dynamo


def _onnx() -> ModuleType:
    from . import onnx

    return onnx


def _executorch() -> ModuleType:
    from . import executorch

    return executorch


# backend -> the import of its package, whose workaround files fill the registry as it is imported
PACKAGES = {"dynamo": _dynamo, "onnx": _onnx, "executorch": _executorch}

# backend -> (exporter class, config class), by their names in its package
EXPORTERS = {
    "dynamo": ("DynamoExporter", "DynamoConfig"),
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "executorch": ("ExecutorchExporter", "ExecutorchConfig"),
}

# backend -> its artifact class, by its name in its package
ARTIFACTS = {"dynamo": "DynamoExported", "onnx": "OnnxExported", "executorch": "ExecutorchExported"}

assert set(PACKAGES) == set(EXPORTERS) == set(ARTIFACTS) == set(BACKENDS), "a backend is missing from a table"


def package(backend: str) -> ModuleType:
    """The package of ``backend``, imported (with its workarounds registered) if it was not yet."""
    return PACKAGES[check_backend(backend)]()


def exporter_for(backend: str, **config):
    """``(exporter, config)`` for a backend name, the config built from keyword options."""
    if backend not in EXPORTERS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    exporter_name, config_name = EXPORTERS[backend]
    module = package(backend)
    return getattr(module, exporter_name)(), getattr(module, config_name)(**config)


def load(directory: str | Path) -> Exported:
    """Load an artifact written by ``Exported.save``; the backend is read from its metadata."""
    directory = Path(directory)
    path = directory / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no {METADATA_FILE}: not a saved export")
    try:
        metadata = json.loads(path.read_text())
        backend = check_backend(metadata["backend"])
    except (json.JSONDecodeError, KeyError, ValueError) as error:
        raise ValueError(f"{path}: unreadable export metadata ({error})") from None
    artifact_class = getattr(package(backend), ARTIFACTS[backend])
    return artifact_class.load_saved(directory, metadata)
