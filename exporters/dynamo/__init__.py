"""The Dynamo backend: a transformers model to a ``torch.export`` ``ExportedProgram`` (``exporter.py``), its
runtime (``runtime.py``), and its model patches (``patches/``, one file per family), which every backend traces
through. Importing this package registers every Dynamo workaround, in order.
"""

from ..pytree import register_pytree_nodes
from . import patches  # noqa: F401  (registers the stage 2 patches first, in their order)
from .exporter import DynamoConfig, DynamoExporter, Traced, auto_dynamic_shapes, trace_model
from .runtime import DynamoExported

__all__ = ["DynamoConfig", "DynamoExported", "DynamoExporter", "Traced", "auto_dynamic_shapes", "register_pytree_nodes",
           "trace_model"]
