"""export-sweep exporters: transformers models to torch.export, ONNX and ExecuTorch, one staged pipeline each.

    exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))
    outputs = exported(**inputs)          # {output name: tensor}, run in ONNX Runtime
    exported.save("out/"); exporters.load("out/")
"""

from .exported import Exported, load, package_versions
from .exporter_dynamo import DynamoConfig, DynamoExported, DynamoExporter, register_pytree_nodes
from .exporter_executorch import ExecutorchConfig, ExecutorchExported, ExecutorchExporter
from .exporter_onnx import OnnxConfig, OnnxExported, OnnxExporter
from .utils import (
    BACKENDS,
    DynamoExportError,
    ExecutorchExportError,
    ExportError,
    OnnxExportError,
    PatchPathError,
    named_leaves,
)

EXPORTERS = {"dynamo": (DynamoExporter, DynamoConfig), "onnx": (OnnxExporter, OnnxConfig), "executorch": (ExecutorchExporter, ExecutorchConfig)}


def exporter_for(backend: str, **config):
    """``(exporter, config)`` for a backend name, the config built from keyword options."""
    if backend not in EXPORTERS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    exporter_class, config_class = EXPORTERS[backend]
    return exporter_class(), config_class(**config)


__all__ = [
    "BACKENDS",
    "DynamoConfig",
    "DynamoExportError",
    "DynamoExported",
    "DynamoExporter",
    "EXPORTERS",
    "ExecutorchConfig",
    "ExecutorchExportError",
    "ExecutorchExported",
    "ExecutorchExporter",
    "ExportError",
    "Exported",
    "OnnxConfig",
    "OnnxExportError",
    "OnnxExported",
    "OnnxExporter",
    "PatchPathError",
    "exporter_for",
    "load",
    "named_leaves",
    "package_versions",
    "register_pytree_nodes",
]
