"""export-sweep exporters: transformers models to torch.export, ONNX and ExecuTorch, one staged pipeline each.

    exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))
    outputs = exported(**inputs)          # {output name: tensor}, run in ONNX Runtime
    exported.save("out/"); exporters.load("out/")

Names are imported on first use, so reading ``exporters.utils.BACKENDS`` does not import torch.
"""

import importlib

_PUBLIC = {
    "Exported": "exported",
    "load": "exported",
    "package_versions": "exported",
    "DynamoConfig": "exporter_dynamo",
    "DynamoExported": "exporter_dynamo",
    "DynamoExporter": "exporter_dynamo",
    "register_pytree_nodes": "exporter_dynamo",
    "OnnxConfig": "exporter_onnx",
    "OnnxExported": "exporter_onnx",
    "OnnxExporter": "exporter_onnx",
    "ExecutorchConfig": "exporter_executorch",
    "ExecutorchExported": "exporter_executorch",
    "ExecutorchExporter": "exporter_executorch",
    "BACKENDS": "utils",
    "ExportError": "utils",
    "DynamoExportError": "utils",
    "OnnxExportError": "utils",
    "ExecutorchExportError": "utils",
    "PatchPathError": "utils",
    "named_leaves": "utils",
}

# backend -> (exporter class, config class), by name
EXPORTERS = {
    "dynamo": ("DynamoExporter", "DynamoConfig"),
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "executorch": ("ExecutorchExporter", "ExecutorchConfig"),
}


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'exporters' has no attribute {name!r}")


def exporter_for(backend: str, **config):
    """``(exporter, config)`` for a backend name, the config built from keyword options."""
    if backend not in EXPORTERS:
        from .utils import BACKENDS

        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    exporter_name, config_name = EXPORTERS[backend]
    return __getattr__(exporter_name)(), __getattr__(config_name)(**config)


__all__ = [*_PUBLIC, "EXPORTERS", "exporter_for"]
