"""Every failure names the stage it happened in, and every stage is timed."""

import pytest
import torch

import exporters

DYNAMO_STAGES = ["signature", "model-patches", "pytree", "dynamic-shapes", "state-cleanup", "torch-export"]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x).relu()


def test_stages_are_recorded_in_order():
    inputs = {"x": torch.randn(2, 4)}
    names = lambda exported: [stage["name"] for stage in exported.metadata["stages"]]  # noqa: E731
    assert names(exporters.DynamoExporter().export(Tiny(), inputs)) == DYNAMO_STAGES
    onnx = exporters.OnnxExporter().export(Tiny(), inputs)
    assert names(onnx) == [
        "torch-patches", *DYNAMO_STAGES, "fx-node-fixes", "onnx-patches", "decompositions", "onnx-translation",
        "optimize", "ir-fixes",
    ]
    assert "optimize" not in names(exporters.OnnxExporter().export(Tiny(), inputs, exporters.OnnxConfig(optimize=False)))
    executorch = exporters.ExecutorchExporter().export(Tiny(), inputs)
    assert names(executorch) == [
        "backend-preparation", "torch-patches", *DYNAMO_STAGES, "executorch-patches", "fx-program-fixes",
        "fx-node-fixes", "to-edge", "to-executorch",
    ]
    assert all(stage["status"] == "pass" and stage["seconds"] >= 0 for stage in executorch.metadata["stages"])


def test_trace_failure_is_attributed_to_torch_export():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # a Python branch on tensor data
                return x
            return -x

    with pytest.raises(exporters.DynamoExportError) as failure:
        exporters.DynamoExporter().export(DataDependent(), {"x": torch.randn(2, 4)})
    assert failure.value.stage == "torch-export"
    assert failure.value.stages[-1] == {**failure.value.stages[-1], "name": "torch-export", "status": "fail"}
    assert str(failure.value).startswith("[dynamo:torch-export] ")


def test_unknown_executorch_backend_fails_in_backend_preparation():
    with pytest.raises(exporters.ExecutorchExportError, match="unknown ExecuTorch backend 'tpu'") as failure:
        exporters.ExecutorchExporter().export(Tiny(), {"x": torch.randn(2, 4)}, exporters.ExecutorchConfig(backend="tpu"))
    assert failure.value.stage == "backend-preparation"


def test_cuda_backend_says_it_needs_cuda():
    with pytest.raises(exporters.ExecutorchExportError, match="needs a CUDA device") as failure:
        exporters.ExecutorchExporter().export(Tiny(), {"x": torch.randn(2, 4)}, exporters.ExecutorchConfig(backend="cuda"))
    assert failure.value.stage == "backend-preparation"


def test_portable_backend_runs_without_delegate():
    model, inputs = Tiny().eval(), {"x": torch.randn(2, 4)}
    exported = exporters.ExecutorchExporter().export(model, inputs, exporters.ExecutorchConfig(backend="portable"))
    (output,) = exported(**inputs).values()
    torch.testing.assert_close(output, model(**inputs), atol=1e-5, rtol=1e-5)


def test_failure_inside_the_converter_keeps_the_inner_stage():
    """A hook inside torch.onnx.export fails: the error names that stage, not the one around the converter."""
    from exporters import registration

    graphs = []

    @registration.register_fx_node_fix("onnx", model_side="planted by a test")
    def _fix_explodes(graph_module, node):
        """Fails on the second graph it sees: the decomposed one."""
        if graph_module not in graphs:
            graphs.append(graph_module)
        if len(graphs) > 1:
            raise RuntimeError("boom after decompositions")
        return False

    try:
        with pytest.raises(exporters.OnnxExportError, match="boom after decompositions") as failure:
            exporters.OnnxExporter().export(Tiny(), {"x": torch.randn(2, 4)})
        assert failure.value.stage == "decompositions"
        from harness.cells import _exporter_stages, _raising_stage  # the sweep's cell names it too

        assert _raising_stage(_exporter_stages(failure.value.stages), failure.value.stage).name == "decompositions"
    finally:
        registration.FX_NODE_FIXES["onnx"].remove(_fix_explodes)


def test_an_executorch_runtime_failure_says_what_the_runtime_logged(tiny, capsys):
    """The runtime tells Python a status code only, and its reason in a log its bindings write to sys.stderr."""
    from exporters.executorch.runtime import explained

    bert = tiny("BertModel")
    exported = exporters.ExecutorchExporter().export(bert.model, bert.inputs["A"])  # static: batch 2, length 7
    capsys.readouterr()
    with pytest.raises(RuntimeError) as failure:
        exported(**bert.inputs["B"])  # batch 3, length 5
    message = str(failure.value)
    assert "failed with error 0x10 (NotSupported): Attempted to resize a static tensor" in message, message
    assert "Expected shape (2, 7), but received (3, 5)" in message and "\n" not in message
    assert "Attempted to resize a static tensor" in capsys.readouterr().err  # the log keeps it
    assert explained("method->execute() failed with error 0x12", "") == (
        "method->execute() failed with error 0x12 (InvalidArgument)"
    )
    log = ("[op_copy.cpp:37] Check failed (tensor_is_broadcastable_to(src, in)): \n"
           "[method.cpp:1483] KernelCall failed at instruction 0:194 in operator aten::copy.out: 0x12\n"
           "[method.cpp:1493] arg 0 with type id 1\n[method.cpp:1493] arg 1 with type id 1\n")  # fmt: skip
    assert explained("method->execute() failed with error 0x12", log) == (
        "method->execute() failed with error 0x12 (InvalidArgument): Check failed (tensor_is_broadcastable_to(src, in)); "
        "KernelCall failed at instruction 0:194 in operator aten::copy.out: 0x12"
    )
