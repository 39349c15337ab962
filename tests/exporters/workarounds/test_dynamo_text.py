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
    check_axes_stay_dynamic,
    check_class_case,
    check_dynamic_cell_case,
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
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # exported on 2 samples of 7 tokens (padded by 1), run on 3 of 5 (padded by 3)
    ("ReformerModel", "dynamo",
     {"_patch_reformer_axial_positions_gathered": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)"),
      "_patch_reformer_padding_written_over": ("run", "4 + -1 * (input_ids.size()[1] % 4) == 1")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


DYNAMIC_CASES = [  # (model class, workaround, the input whose axis it keeps dynamic)
    ("LEDModel", "_patch_led_pads_at_least_one_token", "input_ids"),  # padded to the window by the length's remainder
]


@pytest.mark.parametrize("name, workaround, input_name", DYNAMIC_CASES, ids=[case[1] for case in DYNAMIC_CASES])
def test_a_model_keeps_its_axes_dynamic_with_its_workaround(name, workaround, input_name):
    check_axes_stay_dynamic(name, workaround, input_name)


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
