"""The Dynamo model patches of `exporters/dynamo/patches/text.py` (long-text models): each passes with its workaround
and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    a_whole_number_of_windows,
    built_by_the_sweep,
    export_tiny,
    global_tokens_in_one_sample,
    visual_indicators_after_the_image,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("LongformerForMaskedLM", "dynamo", "_patch_longformer_attention_dense", "data-dependent"),  # global tokens
    # a padding bucket picked by .item(); its bucket cache, hashed by seeded rotations, is an output
    ("ReformerModelWithLMHead", "dynamo", "_patch_reformer_padding_bucket_as_tensors", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    context = built_by_the_sweep(name)
    assert context.ok, context.stages[-1].message
    exported = export_tiny(context, backend)
    assert workaround in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        export_tiny(context, backend)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # exported on 2 samples of 7 tokens (padded by 1), run on 3 of 5 (padded by 3)
    ("ReformerModel", "dynamo",
     {"_patch_reformer_axial_positions_gathered": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)"),
      "_patch_reformer_padding_written_over": ("run", "4 + -1 * (input_ids.size()[1] % 4) == 1")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    """``name``'s dynamic cell as the sweep runs it, with every workaround and with each one disabled: for models
    whose exported outputs are not eager's one for one (a tensor where eager returns None, cache leaves), the
    sweep's parity compares the outputs eager has."""
    from harness.cells import Cell, ClassContext, run_cell
    from harness.models import select

    model_class = select(name)[0]
    context = ClassContext(model_class)
    with_them = run_cell(Cell(model_class, backend, "dynamic"), context)
    assert (with_them.status, with_them.message) == ("pass", None) and set(failures) <= set(with_them.applied)
    for workaround, (stage, message) in failures.items():
        with disabled_workarounds(workaround):
            without = run_cell(Cell(model_class, backend, "dynamic"), context)
        assert without.stage == stage and message in without.message, workaround


DYNAMIC_CASES = [  # (model class, workaround, the input whose axis it keeps dynamic)
    ("LEDModel", "_patch_led_pads_at_least_one_token", "input_ids"),  # padded to the window by the length's remainder
]


@pytest.mark.parametrize("name, workaround, input_name", DYNAMIC_CASES, ids=[case[1] for case in DYNAMIC_CASES])
def test_a_model_keeps_its_axes_dynamic_with_its_workaround(name, workaround, input_name):
    context = built_by_the_sweep(name)
    second = context.inputs["B"]
    assert second[input_name].shape != context.inputs["A"][input_name].shape
    exported = export_tiny(context, "dynamo", dynamic=True)
    assert_parity(exported(**second), context.expected["B"], TOLERANCE["dynamo"])
    with disabled_workarounds(workaround):
        batch_fixed = export_tiny(context, "dynamo", dynamic=True)
    with pytest.raises(Exception, match=input_name):
        batch_fixed(**second)


@pytest.mark.parametrize("name, workaround, vary", [
    ("LongformerForMaskedLM", "_patch_longformer_attention_dense", global_tokens_in_one_sample),
    ("LEDForQuestionAnswering", "_patch_longformer_attention_dense", global_tokens_in_one_sample),
    ("LEDModel", "_patch_led_pads_at_least_one_token", a_whole_number_of_windows),
    ("ReformerModelWithLMHead", "_patch_reformer_padding_bucket_as_tensors", None),
    ("FunnelForMaskedLM", "_patch_funnel_positions_by_their_ends", None),
    ("Ovis2Model", "_patch_ovis2_visual_indicators_by_where", visual_indicators_after_the_image),
])  # fmt: skip
def test_a_rewritten_branch_matches_the_original_on_padded_inputs(name, workaround, vary):
    """The inputs of the sweep with padding (and whatever else ``vary`` changes): eager with the patch installed."""

    context = built_by_the_sweep(name)
    inputs = {key: value.clone() for key, value in context.inputs["A"].items()}
    inputs["attention_mask"][0, -2:] = 0
    if vary:
        vary(inputs)
    fired = set()
    with torch.no_grad():
        original = exporters.named_leaves(context.model(**inputs))
        with apply_patches("dynamo", fired):
            rewritten = exporters.named_leaves(context.model(**inputs))
    assert workaround in fired
    assert_parity(rewritten, original, TOLERANCE["dynamo"])


def test_funnel_keeps_its_sequence_axis_dynamic():
    """Its positions were a Python list as long as the sequence, which fixed the length in the trace."""
    context = built_by_the_sweep("FunnelForMaskedLM")
    exported = export_tiny(context, "dynamo", dynamic=True)
    assert "_patch_funnel_positions_by_their_ends" in exported.applied
    assert isinstance(exported.metadata["input_shapes"]["input_ids"][1], str)  # a symbol
    with disabled_workarounds("_patch_funnel_positions_by_their_ends"):
        length_fixed = export_tiny(context, "dynamo", dynamic=True)
    assert length_fixed.metadata["input_shapes"]["input_ids"][1] == context.inputs["A"]["input_ids"].shape[1]
