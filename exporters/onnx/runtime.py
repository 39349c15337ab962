"""OnnxExported: an ONNX graph called like the model, run by an ONNX Runtime CPU session."""

from __future__ import annotations

from pathlib import Path

import torch

from ..exported import Exported


class OnnxExported(Exported):
    backend = "onnx"
    program_file = "model.onnx"

    def __init__(self, program, metadata, session=None):
        super().__init__(program, metadata)
        self._session = session

    def _runtime(self):
        if self._session is None:
            import onnx_ir

            self._session = open_session(onnx_ir.to_proto(self.program).SerializeToString())
        return self._session

    session = property(_runtime)

    def _run(self, feed):
        session_inputs = {value.name for value in self.session.get_inputs()}
        named = {name: tensor.numpy() for name, tensor in zip(self.input_names, feed) if name in session_inputs}
        return [torch.from_numpy(array) for array in self.session.run(None, named)]

    def _save_program(self, path: Path) -> None:
        import onnx_ir

        onnx_ir.save(self.program, str(path), external_data=f"{path.name}.data")

    @classmethod
    def load_saved(cls, directory, metadata):
        import onnx_ir

        path = directory / cls.program_file
        return cls(onnx_ir.load(str(path)), metadata, session=open_session(str(path)))


def open_session(model):
    """An ONNX Runtime CPU session using as many threads as torch does here (the harness sets that one knob)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
