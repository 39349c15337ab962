"""The Dynamo model patches of `exporters/dynamo/patches/attention.py` (attention masks and kernels, and packed-
sequence attention as one masked SDPA): each passes with its workaround and fails, or differs from eager, without
it.
"""

import contextlib

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds
from exporters.dynamo.patches.attention import SEGMENTED_ATTENTION

from ..conftest import TOLERANCE, assert_parity
from .modules import built_by_the_sweep, check_class_case, check_dynamic_cell_case, export_module, export_tiny


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("Gemma3ForSequenceClassification", "onnx", "_patch_mask_by_broadcast", "vmapped"),  # bidirectional images
    # its distilling convolutions halve the sequence under a mask built for the whole of it
    ("InformerModel", "dynamo", "_patch_no_padding_means_no_mask", "Attention mask should be of size"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # its vision attention is flagged causal: eager, dropping the mask that hides nothing, attends causally
    ("Phi4MultimodalVisionModel", "dynamo",
     {"_patch_phi4_vision_mask_causal_when_it_hides_nothing": ("parity", "last_hidden_state (max abs 4.34)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_packed_images_attend_through_one_masked_sdpa(tiny, backend, monkeypatch):
    model = tiny("Qwen2VisionTransformerPretrainedModel")
    exported = export_tiny(model, backend, dynamic=True)  # the image grid traced, not baked in
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**model.inputs["A"]), model.expected["A"], TOLERANCE[backend])
    assert model.model.config._attn_implementation != SEGMENTED_ATTENTION, "restored"
    # without it the tower splits its sequence by sizes read from the traced grid's values (a static export bakes
    # the grid in, and its sizes are numbers)
    monkeypatch.setattr("exporters.dynamo.exporter.segmented_attention", lambda model, fired: contextlib.nullcontext())
    with pytest.raises(exporters.ExportError, match="data-dependent") as failure:
        export_tiny(model, backend, dynamic=True)
    assert failure.value.stage == "torch-export"


# and a retriever wrapping one (its positions need token types it does not take; its text layers meet the segmented
# attention without boundaries)
@pytest.mark.parametrize("name", ["Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                                  "ColQwen2ForRetrieval"])
def test_a_qwen_vl_model_exports_with_its_rotary_positions_fed(name):
    context = built_by_the_sweep(name)
    assert "position_ids" in context.inputs["A"]  # computed by the inputs, as a runner would (and 2.5's windows)
    exported = export_tiny(context, "dynamo")
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])


def test_packed_attention_under_a_data_dependent_length_exports():
    """MiniCPM-V's merger packs a length read from the image sizes: the segmented attention must not guard on it."""
    context = built_by_the_sweep("MiniCPMV4_6ForConditionalGeneration")
    exported = export_tiny(context, "dynamo")
    assert "segmented_attention" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])


def test_a_causal_mask_without_padding_is_skipped_as_eager_skips_it_for_a_module_that_is_not_causal():
    context = built_by_the_sweep("Aimv2TextModel")  # non-causal attention modules, causal masks
    inputs = context.inputs["A"]
    exported = export_tiny(context, "dynamo")
    assert "_patch_sdpa_skips_a_future_only_mask_as_eager_does" in exported.applied
    assert_parity(exported(**inputs), context.expected["A"], TOLERANCE["dynamo"])  # no padding: eager has no mask
    padded = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    padded["attention_mask"][0, -2:] = 0  # with padding eager keeps the causal mask: so does the program
    assert_parity(exported(**padded), context._forward(padded), TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_sdpa_skips_a_future_only_mask_as_eager_does"):
        causal = export_tiny(context, "dynamo")
    with pytest.raises(AssertionError):
        assert_parity(causal(**inputs), context.expected["A"], TOLERANCE["dynamo"])


def test_a_cross_attention_traced_with_equal_lengths_keeps_its_decoder_length_free():
    """The patch asks whether an attention is square only of its shapes' symbols: asking of their sizes merged a
    seq-to-seq program's decoder length into its encoder's when both were traced at 7."""
    context = built_by_the_sweep("BartModel")
    inputs = context.inputs["A"]
    assert inputs["decoder_input_ids"].shape[1] == inputs["input_ids"].shape[1]
    exported = export_tiny(context, "dynamo", dynamic=True)
    shorter = dict(inputs, decoder_input_ids=inputs["decoder_input_ids"][:, :3])
    assert_parity(exported(**shorter), context._forward(shorter), TOLERANCE["dynamo"])


def test_local_attention_without_a_padding_mask_keeps_the_sequence_length_free():
    """Without a padding mask the patch skipped ModernBERT's local-window mask when the traced length fit the
    window, and the program refused any sequence past it."""
    context = built_by_the_sweep("ModernBertModel")
    exported = export_module(context.model, {"input_ids": context.inputs["A"]["input_ids"]}, "dynamo", dynamic=True)
    longer = {"input_ids": torch.randint(5, 90, (2, context.model.config.local_attention + 12))}
    assert_parity(exported(**longer), context._forward(longer), TOLERANCE["dynamo"])


def test_attention_over_the_patches_a_mask_leaves_visible_exports_and_follows_the_mask():
    context = built_by_the_sweep("VideoMAEForPreTraining")  # encodes the patches left visible
    inputs = context.inputs["A"]
    exported = export_tiny(context, "dynamo")
    assert "_patch_sdpa_on_queries_counted_from_data" in exported.applied
    assert_parity(exported(**inputs), context.expected["A"], TOLERANCE["dynamo"])
    fewer_hidden = dict(inputs, bool_masked_pos=inputs["bool_masked_pos"].clone())
    for hidden in fewer_hidden["bool_masked_pos"]:  # two more visible in every sample: a longer encoded sequence
        hidden[hidden.nonzero()[:2, 0]] = False
    assert_parity(exported(**fewer_hidden), context._forward(fewer_hidden), TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_sdpa_on_queries_counted_from_data"):
        with pytest.raises(exporters.DynamoExportError, match="data-dependent"):
            export_tiny(context, "dynamo")
