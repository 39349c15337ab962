"""export-sweep exporters: transformers models to torch.export, ONNX and ExecuTorch, one staged pipeline each.

    exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))
    outputs = exported(**inputs)          # {output name: tensor}, run in ONNX Runtime
    exported.save("out/"); exporters.load("out/")

A backend's names (``OnnxExporter``, ``DynamoConfig``, ...) are read from its package on first use, which imports it
(:mod:`exporters.backends`): importing ``exporters``, or reading ``exporters.BACKENDS``, does not import torch.
"""

from .backends import BACKENDS, EXPORTERS, exporter_for, load, package
from .errors import DynamoExportError, ExecutorchExportError, ExportError, OnnxExportError, PatchPathError
from .exported import Exported
from .versions import package_versions
from .leaves import named_leaves

# name -> the backend whose package defines it
_BACKEND_NAMES = {
    "DynamoConfig": "dynamo",
    "DynamoExported": "dynamo",
    "DynamoExporter": "dynamo",
    "register_pytree_nodes": "dynamo",
    "OnnxConfig": "onnx",
    "OnnxExported": "onnx",
    "OnnxExporter": "onnx",
    "ExecutorchConfig": "executorch",
    "ExecutorchExported": "executorch",
    "ExecutorchExporter": "executorch",
}


def __getattr__(name):
    if name in _BACKEND_NAMES:
        value = getattr(package(_BACKEND_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exporters' has no attribute {name!r}")


__all__ = [
    "BACKENDS", "EXPORTERS", "DynamoExportError", "ExecutorchExportError", "ExportError", "Exported", "OnnxExportError",
    "PatchPathError", "exporter_for", "load", "named_leaves", "package_versions", *_BACKEND_NAMES,
]  # fmt: skip
