"""The Dynamo model patches of `exporters/dynamo/patches/experts.py` (mixture-of-experts layers and their neighbours):
each passes with its workaround and fails, or differs from eager, without it.
"""

import pytest

import exporters
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    check_axes_stay_dynamic,
    check_class_case,
    export_tiny,
    exported_on_the_varying_axes,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("LongcatFlashModel", "dynamo", "_patch_longcat_flash_experts_dense", "data-dependent"),
    ("DbrxForCausalLM", "dynamo", "_patch_dbrx_experts_dense", "data-dependent"),
    ("Step3p7TextModel", "dynamo", "_patch_step3p7_experts_dense", "data-dependent"),
    ("SwitchTransformersForConditionalGeneration", "dynamo", "_patch_switch_transformers_experts_dense", "data-dep"),
    ("Wav2Vec2ForXVector", "executorch", "_patch_xvector_masked_statistics", "data-dependent"),  # slice to length
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CASES = [  # (model class, workaround, the input whose axis it keeps dynamic)
    ("Wav2Vec2ForXVector", "_patch_xvector_masked_statistics", "attention_mask"),  # pooled sample by sample
]


@pytest.mark.parametrize("name, workaround, input_name", DYNAMIC_CASES, ids=[case[1] for case in DYNAMIC_CASES])
def test_a_model_keeps_its_axes_dynamic_with_its_workaround(name, workaround, input_name):
    check_axes_stay_dynamic(name, workaround, input_name)


@pytest.mark.parametrize(
    "backend, error, stage",
    [("onnx", "erf_inv", "onnx-translation"), ("executorch", "erfinv.default is not in Core ATen", "to-edge")],
)
def test_gemma3n_sparsity_quantile_is_a_constant_for_export(tiny, backend, error, stage):
    model = tiny("Gemma3nForCausalLM")  # its first layer keeps the top 5% of the MLP gate
    exported = export_tiny(model, backend)
    assert "_patch_gemma3n_constant_icdf" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    with disabled_workarounds("_patch_gemma3n_constant_icdf"):
        with pytest.raises(exporters.ExportError, match=error) as failure:
            export_tiny(model, backend)
    assert failure.value.stage == stage
    assert error in failure.value.message.split("\n\n")[0], "the cause leads the message, before any advice"


def test_step3p7_tower_lays_out_its_positions_from_its_grid_not_from_data():
    """Written into a tensor and read back, the tower's grid sizes were data-dependent: ExecuTorch found no bound to
    plan its positions for."""

    def read_from_data(exported):
        return [symbol for symbol in exported.program.range_constraints if str(symbol).startswith("u")]

    _, exported, export = exported_on_the_varying_axes("Step3p7VisionModel", ["_patch_step3p7_positions_from_the_grid"])
    assert read_from_data(exported) == []
    with disabled_workarounds("_patch_step3p7_positions_from_the_grid"):
        assert read_from_data(export())
