"""The ExecuTorch backend: the Dynamo trace lowered to a ``.pte`` program (``exporter.py``), run by the ExecuTorch
runtime (``runtime.py``); its workarounds one file per stage. Importing this package registers every ExecuTorch
workaround (and the Dynamo ones it traces through), in stage order.
"""

# the stages' workaround files, in stage order: patches install, and fixes run, in registration order
from . import backends  # noqa: F401  isort: skip
from . import torch_patches  # noqa: F401  isort: skip
from . import lowering_patches  # noqa: F401  isort: skip
from . import program_fixes  # noqa: F401  isort: skip
from . import node_fixes  # noqa: F401  isort: skip
from .exporter import ExecutorchConfig, ExecutorchExporter
from .runtime import ExecutorchExported, execution_plan

__all__ = ["ExecutorchConfig", "ExecutorchExported", "ExecutorchExporter", "execution_plan"]
