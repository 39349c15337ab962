"""The ONNX workarounds of `exporters/onnx/workarounds.py`: each passes with its workaround and fails, or differs from
eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from .modules import (
    BucketsModuloLength,
    CheckedTokens,
    ClippedProjections,
    InvertedMask,
    KeptWhileRunning,
    MainAndPredictedStreams,
    ModalityMasks,
    PatchIndexPerImage,
    RowsOfSamples,
    ShuffledRows,
    SpecialTokenSpans,
    SqueezedProjection,
    TinyEpsilonNorm,
    TransducerJoint,
    check_pattern_case,
    export_module,
    export_tiny,
)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("onnx", CheckedTokens, {"input_ids": torch.tensor([[3, 1, 4], [1, 5, 9]])},
     "_aten__is_all_true", "No ONNX function found for .*_is_all_true"),
    ("onnx", InvertedMask, {"attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])},
     "_fix_number_minus_tensor", "compatible OpOverload for aten.sub"),
    ("onnx", PatchIndexPerImage, {"patches": torch.randn(5, 3), "patches_per_image": torch.tensor([2, 3])},
     "_aten_sym_numel", "No ONNX function found for .*sym_numel"),
    ("onnx", SpecialTokenSpans, {"positions": torch.tensor([[-1, 2, -1, -1, 4, 4, -1], [0, -1, 3, 1, -1, 3, 6]])},
     "_patch_running_extremes_by_comparison", "No ONNX function found for .*cumm"),
    ("onnx", RowsOfSamples,
     {"sample_lengths": torch.tensor([3, 1, 4]), "row_starts": torch.tensor([0.0, 3, 3.5, 4, 7])},
     "_aten_searchsorted", "No ONNX function found for .*searchsorted"),
    ("onnx", ShuffledRows, {"rows": torch.randn(5, 3)}, "_aten_randperm", "No ONNX function found for .*randperm"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_t5_onnx_needs_the_reshape_fix(tiny):
    model = tiny("T5ForConditionalGeneration")
    exported = export_tiny(model, "onnx")
    assert "_fix_reshape_of_strided_view" in exported.applied
    with disabled_workarounds("_fix_reshape_of_strided_view"):
        with pytest.raises(exporters.OnnxExportError, match="Cannot view a tensor") as failure:
            export_tiny(model, "onnx")
    assert failure.value.stage == "decompositions"


def test_python_numbers_among_the_outputs_stay_out_of_the_onnx_graph():
    class StepPredictor(torch.nn.Module):  # Qwen3-Omni's code predictor returns the step it is at
        def forward(self, embeddings):
            return {"logits": embeddings * 2, "generation_steps": embeddings.shape[1] - 2}

    inputs = {"embeddings": torch.randn(2, 5)}
    exported = export_module(StepPredictor(), inputs, "onnx")
    assert "_patch_constant_outputs_left_out" in exported.applied
    assert exported(**inputs).keys() == exporters.named_leaves(StepPredictor()(**inputs)).keys() == {"logits"}
    assert torch.equal(exported(**inputs)["logits"], inputs["embeddings"] * 2)
    with disabled_workarounds("_patch_constant_outputs_left_out"), pytest.raises(exporters.ExportError, match="name"):
        export_module(StepPredictor(), inputs, "onnx")


def test_the_onnx_optimizer_names_the_bounds_it_fuses_apart():
    model, inputs = ClippedProjections().eval(), {"hidden_states": 3 * torch.randn(2, 4)}
    exported = export_module(model, inputs, "onnx")
    assert "_patch_fused_bounds_named_by_their_node" in exported.applied
    for got, want in zip(exported(**inputs).values(), model(**inputs), strict=True):
        torch.testing.assert_close(got, want)
    with disabled_workarounds("_patch_fused_bounds_named_by_their_node"):
        unpatched = export_module(model, inputs, "onnx")
        with pytest.raises(Exception, match="is not a graph input"):
            unpatched(**inputs)


def test_onnx_runtime_chooses_between_masks_by_logic():
    model = KeptWhileRunning()
    inputs = {"running": torch.tensor([[True], [False]]), "kept": torch.tensor([[True, False, False]] * 2),
              "live": torch.tensor([[True, True, False]] * 2)}
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, inputs, config)
    assert "_fix_ir_where_on_booleans" in exported.applied
    other = {name: torch.cat([value, ~value]) for name, value in inputs.items()}  # another batch
    (got,) = exported(**other).values()
    assert torch.equal(torch.as_tensor(got), model(**other))
    with disabled_workarounds("_fix_ir_where_on_booleans"):
        as_converted = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="implementation for Where"):
        as_converted(**inputs)


def test_the_onnx_optimizer_keeps_an_epsilon_below_its_zero_tolerance():
    model, x = TinyEpsilonNorm().eval(), torch.randn(2, 8) * 1e-5  # a mean square of 1e-10: the epsilon dominates
    exporter, config = exporters.exporter_for("onnx")
    exported = exporter.export(model, {"x": x}, config)
    assert "_patch_optimizer_zero_means_zero" in exported.applied
    torch.testing.assert_close(exported(x=x)["output"], model(x), atol=1e-5, rtol=1e-4)
    with disabled_workarounds("_patch_optimizer_zero_means_zero"):
        without_epsilon = exporter.export(model, {"x": x}, config)
    assert not torch.allclose(without_epsilon(x=x)["output"], model(x), atol=1e-3, rtol=1e-2)


def test_onnx_squeeze_of_a_symbolic_axis_of_two_or_more_is_left_out():
    model = TransducerJoint()
    inputs = {"frames": torch.randn(2, 7, 4), "labels": torch.randn(2, 5, 4)}
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, inputs, config)
    assert "_fix_squeeze_of_a_longer_axis" in exported.applied
    other = {"frames": torch.randn(3, 6, 4), "labels": torch.randn(3, 3, 4)}
    (joint,) = exported(**other).values()
    torch.testing.assert_close(torch.as_tensor(joint), model(**other), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_fix_squeeze_of_a_longer_axis"):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="must be 1 instead of 3"):
        as_traced(**other)


def test_onnx_squeeze_of_an_axis_longer_than_one_is_left_out():
    model, inputs = SqueezedProjection().eval(), {"tokens": torch.randn(8, 4)}
    exporter, config = exporters.exporter_for("onnx")
    exported = exporter.export(model, inputs, config)
    assert "_fix_squeeze_of_a_longer_axis" in exported.applied
    torch.testing.assert_close(exported(**inputs)["output"], model(**inputs), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_fix_squeeze_of_a_longer_axis"):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(Exception, match="must be 1 instead of 8"):
        as_traced(**inputs)


def test_onnx_draws_bernoulli_ones_with_their_probability():
    model, inputs = ModalityMasks(), {"audio": torch.randn(2, 6, 3), "label": torch.randn(2, 1, 3)}
    exported = export_module(model, inputs, "onnx", dynamic=True)
    assert "_aten_bernoulli" in exported.applied
    other = {"audio": torch.randn(3, 4, 3), "label": torch.randn(3, 1, 3)}
    for got, expected in zip(exported(**other).values(), model(**other), strict=True):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_aten_bernoulli"):
        as_runtime_draws = export_module(model, inputs, "onnx", dynamic=True)
    audio, label = as_runtime_draws(**other).values()
    assert not audio.any() and torch.equal(label, other["label"]), "ONNX Runtime's Bernoulli draws the complement"


def test_a_split_by_a_symbolic_size_is_left_to_onnx_runtime():
    model, hidden = MainAndPredictedStreams(), torch.randn(2, 8, 4)
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, {"hidden": hidden}, config)
    assert "_patch_split_by_a_symbolic_size_left_unfolded" in exported.applied
    other = torch.randn(3, 12, 4)
    (streams,) = exported(hidden=other).values()
    torch.testing.assert_close(torch.as_tensor(streams), model(other), atol=1e-6, rtol=1e-6)
    with disabled_workarounds("_patch_split_by_a_symbolic_size_left_unfolded"):
        with pytest.raises(exporters.ExportError, match="optimize"):
            exporter.export(model, {"hidden": hidden}, config)


def test_a_remainder_by_a_symbolic_size_runs_in_onnx_runtime():
    model, positions = BucketsModuloLength(), torch.arange(-6, 8).view(2, 7)
    exporter, config = exporters.exporter_for("onnx", dynamic=True)
    exported = exporter.export(model, {"positions": positions}, config)
    assert "_fix_remainder_by_a_symbolic_size" in exported.applied
    other = torch.arange(-9, 6).view(3, 5)  # Python's sign: the divisor's
    (remainders,) = exported(positions=other).values()
    assert torch.equal(torch.as_tensor(remainders), model(other))
    with disabled_workarounds("_fix_remainder_by_a_symbolic_size"), pytest.raises(exporters.ExportError, match="int()"):
        exporter.export(model, {"positions": positions}, config)
