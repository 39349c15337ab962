"""ExecutorchExported: a ``.pte`` program called like the model, run by the ExecuTorch runtime."""

from __future__ import annotations

import re
import sys
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
                self._method = with_runtime_log(lambda: Runtime.get().load_program(self.program).load_method("forward"))
            except RuntimeError as error:
                missing = _operators_without_kernels(self.program)
                if missing:
                    raise RuntimeError(f"the ExecuTorch runtime has no kernel for {', '.join(missing)}") from error
                raise
        return self._method

    method = property(_runtime)

    def _run(self, feed):
        method = self.method  # loaded first: what loading logs is not this call's
        outputs = list(with_runtime_log(lambda: method.execute(feed)))
        # inputs the program updates in place (a static cache) come back first: the user outputs follow them
        return outputs[self.metadata.get("mutated_inputs", 0) :]

    def _save_program(self, path: Path) -> None:
        path.write_bytes(self.program)

    @classmethod
    def load_saved(cls, directory, metadata):
        return cls((directory / cls.program_file).read_bytes(), metadata)


# executorch/runtime/core/error.h (1.5.1): what a status code in the runtime's Python errors means
ERROR_NAMES = {
    0x01: "Internal", 0x02: "InvalidState", 0x03: "EndOfMethod", 0x04: "AlreadyLoaded", 0x10: "NotSupported",
    0x11: "NotImplemented", 0x12: "InvalidArgument", 0x13: "InvalidType", 0x14: "OperatorMissing",
    0x15: "RegistrationExceedingMaxKernels", 0x16: "RegistrationAlreadyRegistered", 0x20: "NotFound",
    0x21: "MemoryAllocationFailed", 0x22: "AccessFailed", 0x23: "InvalidProgram", 0x24: "InvalidExternalData",
    0x25: "OutOfResources", 0x30: "DelegateInvalidCompatibility", 0x31: "DelegateMemoryAllocationFailed",
    0x32: "DelegateInvalidHandle",
}  # fmt: skip
_ERROR_CODE = re.compile(r"error:? 0x:?([0-9a-fA-F]+)\b")  # "error 0x12", and loading's "error: 0x:23"
_LOG_SOURCE = re.compile(r"^\[[\w.]+:\d+\]\s*")  # "[op_copy.cpp:37] ": where in the runtime's code
_LOG_NOISE = re.compile(r"^arg \d+ with type id \d+$")  # the failed kernel's arguments, listed after its failure
_LOG_LINES_KEPT = 3


def with_runtime_log(call):
    """``call()``. The runtime reports a failure to Python as a status code ("failed with error 0x12") and its reason
    in its log, which its bindings write to ``sys.stderr``: an error raised here has the code's name and the last
    lines the runtime logged during the call. The log still reaches stderr."""
    stderr = sys.stderr
    if stderr is None:  # no stream to pass the log on to (pythonw): the bindings write nowhere either
        return call()
    sys.stderr = tee = _Tee(stderr)
    try:
        return call()
    except RuntimeError as error:
        raise RuntimeError(explained(str(error), tee.written)) from error
    finally:
        sys.stderr = stderr


class _Tee:
    """A stream that passes on what is written to it and keeps its end."""

    KEPT = 20_000  # characters: a long generate logs on, the failure is told last

    def __init__(self, target):
        self.target, self.written = target, ""

    def write(self, text):
        self.written = (self.written + text)[-self.KEPT :]
        return self.target.write(text)

    def __getattr__(self, name):  # flush, fileno, encoding...: the target's
        return getattr(self.target, name)


def explained(message: str, log: str) -> str:
    """The runtime's error message with its status code named and the last lines it logged, on one line."""
    code = _ERROR_CODE.search(message)
    if code and int(code.group(1), 16) in ERROR_NAMES:
        message = f"{message} ({ERROR_NAMES[int(code.group(1), 16)]})"
    lines = [_LOG_SOURCE.sub("", line).strip().rstrip(".:") for line in log.splitlines()]
    lines = [line for line in lines if line and not _LOG_NOISE.match(line)][-_LOG_LINES_KEPT:]
    return f"{message}: {'; '.join(lines)}" if lines else message


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
