"""DynamoExported: a traced ``ExportedProgram`` called like the model, run by torch itself."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils import _pytree

from ..exported import Exported
from ..pytree import register_pytree_nodes


class DynamoExported(Exported):
    backend = "dynamo"
    program_file = "model.pt2"

    def __init__(self, program, metadata):
        super().__init__(program, metadata)
        self._module = None

    def _runtime(self):
        if self._module is None:
            module = self.program.module()
            # Return the flat leaves as traced: rebuilding caches and flattening them again would drop a leaf the
            # dynamic trace turned into a number (a sliding window's position counter).
            module._out_spec = _pytree.tree_structure(tuple(range(module._out_spec.num_leaves)))
            self._module = module
        return self._module

    def _run(self, feed):
        args, kwargs = _pytree.tree_unflatten(feed, self.program.call_spec.in_spec)
        with torch.no_grad():
            return list(self._runtime()(*args, **kwargs))

    def _save_program(self, path: Path) -> None:
        torch.export.save(self.program, str(path))

    @classmethod
    def load_saved(cls, directory, metadata):
        register_pytree_nodes()
        return cls(torch.export.load(str(directory / cls.program_file)), metadata)

