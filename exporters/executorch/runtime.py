"""ExecutorchExported: a ``.pte`` program called like the model, run by the ExecuTorch runtime."""

from __future__ import annotations

from pathlib import Path

from ..exported import Exported


class ExecutorchExported(Exported):
    backend = "executorch"
    program_file = "model.pte"

    def __init__(self, program: bytes, metadata):
        super().__init__(program, metadata)
        self._method = None

    def _runtime(self):
        if self._method is None:
            from executorch.runtime import Runtime

            try:
                self._method = Runtime.get().load_program(self.program).load_method("forward")
            except RuntimeError as error:
                missing = _operators_without_kernels(self.program)
                if missing:
                    raise RuntimeError(f"the ExecuTorch runtime has no kernel for {', '.join(missing)}") from error
                raise
        return self._method

    method = property(_runtime)

    def _run(self, feed):
        outputs = list(self.method.execute(feed))
        # inputs the program updates in place (a static cache) come back first: the user outputs follow them
        return outputs[self.metadata.get("mutated_inputs", 0) :]

    def _save_program(self, path: Path) -> None:
        path.write_bytes(self.program)

    @classmethod
    def load_saved(cls, directory, metadata):
        return cls((directory / cls.program_file).read_bytes(), metadata)


def execution_plan(program: bytes):
    """The serialized program's plan for `forward`: its operators, its planned memory buffers."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    deserialized = deserialize_pte_binary(program)
    return getattr(deserialized, "program", deserialized).execution_plan[0]  # newer releases wrap it with segments


def _operators_without_kernels(program: bytes) -> list[str]:
    """The operators a serialized program calls that the runtime registers no kernel for."""
    from executorch.extension.pybindings.portable_lib import _get_operator_names

    called = {f"{op.name}.{op.overload}" if op.overload else op.name for op in execution_plan(program).operators}
    return sorted(called - set(_get_operator_names()))
