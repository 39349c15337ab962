"""The Dynamo model patches of `exporters/dynamo/patches/generic.py` (torch- and transformers-wide code): each passes
with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    OverflowClamped,
    RankedQueries,
    TokensPastTheLastWindow,
    check_class_case,
    check_dynamic_cell_case,
    check_pattern_case,
    export_tiny,
    fixed_axes_with_and_without,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("SwitchTransformersForConditionalGeneration", "dynamo", "_patch_module_cast_to_its_own_dtype", "Couldn't swap"),
    ("OpenAIPrivacyFilterModel", "dynamo", "_patch_experts_batched_mm", "data-dependent"),  # asks for the eager loop
    # its experts' config names no implementation: the eager loop
    ("DiffusionGemmaDecoderModel", "dynamo", "_patch_experts_batched_mm", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # counts its prompts with `len(input_ids)`
    ("CLIPSegForImageSegmentation", "dynamo",
     {"_patch_len_of_tensor_symbolic": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


def test_a_float16_overflow_check_exports_and_clamps_as_eager_does():
    finite = {"hidden": torch.randn(2, 3, dtype=torch.float16)}
    check_pattern_case("dynamo", OverflowClamped, finite, "_patch_half_overflow_check_answered", "data-dependent")
    model, overflowing = OverflowClamped().eval(), {"hidden": torch.tensor([[40000.0, -40000.0, 1.0]] * 2).half()}
    exported = exporters.DynamoExporter().export(model, finite)
    assert torch.equal(exported(**overflowing)["output"], model(**overflowing))  # eager took the clamp branch


def test_nllb_moe_exports_through_dynamo_with_its_patches(tiny):
    from transformers.models.nllb_moe import modeling_nllb_moe

    router = modeling_nllb_moe.NllbMoeTop2Router
    original_to, original_forward = torch.nn.Module.to, router.forward
    seen_during_export = []
    model = tiny("NllbMoeForConditionalGeneration")

    def spying_forward(self, *args, **kwargs):
        seen_during_export.append(torch.nn.Module.to is not original_to)
        return original_forward(self, *args, **kwargs)

    router.forward = spying_forward
    try:
        exported = export_tiny(model, "dynamo", dynamic=True)
    finally:
        router.forward = original_forward
    assert seen_during_export and all(seen_during_export), "the cast patch is active while the model is traced"
    assert torch.nn.Module.to is original_to, "and gone after"
    assert {"_patch_module_cast_to_its_own_dtype", "_patch_nllb_moe_experts_dense"} <= set(exported.applied)
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["dynamo"])
    assert_parity(exported(**model.inputs["B"]), model.expected["B"], TOLERANCE["dynamo"])


@pytest.mark.parametrize(
    "workaround, error",
    [("_patch_module_cast_to_its_own_dtype", "Couldn't swap"), ("_patch_nllb_moe_experts_dense", "data-dependent")],
)
def test_nllb_moe_fails_without_each_patch(tiny, workaround, error):
    with disabled_workarounds(workaround), pytest.raises(exporters.DynamoExportError, match=error) as failure:
        export_tiny(tiny("NllbMoeForConditionalGeneration"), "dynamo")
    assert failure.value.stage == "torch-export"


def test_mixture_of_experts_runs_batched_matmuls_for_export(tiny):
    model = tiny("Qwen2MoeForCausalLM")
    exported = export_tiny(model, "onnx")
    assert "_patch_experts_batched_mm" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE["onnx"])
    with disabled_workarounds("_patch_experts_batched_mm"):
        with pytest.raises(exporters.OnnxExportError, match="grouped_mm_fallback"):
            export_tiny(model, "onnx")


def test_dense_models_do_not_report_the_experts_patch(tiny):
    assert "_patch_experts_batched_mm" not in export_tiny(tiny("LlamaForCausalLM"), "dynamo").applied


def test_take_along_dim_as_gather_keeps_batch_and_queries_symbolic():
    model = RankedQueries()
    axes = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}  # batch and queries
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes={"queries": axes})

    def export():
        return exporter.export(model, {"queries": torch.randn(2, 5, 5)}, config)

    exported = export()
    assert "_patch_take_along_dim_as_gather" in exported.applied
    other = torch.randn(3, 7, 5)
    for got, expected in zip(exported(queries=other).values(), model(other)):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_patch_take_along_dim_as_gather"):
        assert export().metadata["input_shapes"]["queries"] == [2, 5, 5]


@pytest.mark.parametrize("name, workaround, fixed_without", [
    ("RTDetrModel", "_patch_len_of_tensor_symbolic", ["pixel_values axis 0 = 2 (second set: 3)"]),
    ("DepthProModel", "_patch_len_of_tensor_symbolic", ["pixel_values axis 0 = 2 (second set: 3)"]),
    ("EsmForProteinFolding", "_patch_range_of_symbolic_batch_as_arange", [
        "input_ids axis 0 = 2 (second set: 3)", "attention_mask axis 0 = 2 (second set: 3)"]),
    ("Qwen2_5OmniToken2WavDiTModel", "_patch_len_of_tensor_symbolic", [  # its speaker pooling's mask
        f"{name} axis 0 = 2 (second set: 3)" for name in (
            "hidden_states", "condition_vector", "speaker_embedding", "quantized_code", "time_step")]),
])  # fmt: skip
def test_a_symbolic_batch_stays_where_the_code_reads_it_as_a_python_int(name, workaround, fixed_without):
    assert fixed_axes_with_and_without(name, [workaround]) == {workaround: fixed_without}


def test_contiguity_of_a_symbolic_size_is_recorded_without_a_guard():
    model = TokensPastTheLastWindow()
    exporter, config = exporters.exporter_for("dynamo", dynamic=True)
    traced_on, run_on = torch.randn(2, 7, 3), torch.randn(2, 5, 3)  # 3 tokens left over, then 1
    exported = exporter.export(model, {"hidden": traced_on}, config)
    assert "_patch_contiguity_asked_without_guards" in exported.applied
    for got, expected in zip(exported(hidden=run_on).values(), model(run_on), strict=True):
        torch.testing.assert_close(got, expected)
    with disabled_workarounds("_patch_contiguity_asked_without_guards"):
        as_guarded = exporter.export(model, {"hidden": traced_on}, config)
    with pytest.raises(AssertionError, match=r"hidden.size\(\)\[1\] \+ -4 \* \(hidden.size\(\)\[1\] // 4\) != 1"):
        as_guarded(hidden=run_on)
