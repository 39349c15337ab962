"""The Dynamo model patches of `exporters/dynamo/patches/audio.py` (speech and audio models and their neighbours): each
passes with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    PatchEntropy,
    TaskPrompts,
    built_by_the_sweep,
    check_class_case,
    check_dynamic_cell_case,
    check_pattern_case,
    export_tiny,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    ("EncodecModel", "dynamo", "_patch_codec_conv_paddings_as_ints", "data-dependent"),  # paddings from 0-d buffers
    ("FastSpeech2ConformerModel", "dynamo", "_patch_length_regulator_gathered", "data-dependent"),  # loop, branch
    # its decoder's frame count is read from the durations, and its position table grows past it
    ("FastSpeech2ConformerModel", "dynamo", "_patch_relative_positions_within_table", "data-dependent"),
    # prompt features cached by their token ids, read as numbers
    ("OmDetTurboForObjectDetection", "dynamo", "_patch_omdet_prompts_encoded_at_once", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # repeats each sample's units for their durations in a loop over the batch
    ("SeamlessM4TCodeHifiGan", "dynamo",
     {"_patch_seamless_m4t_units_repeated_at_once": ("dynamic-axes", "input_ids axis 0 = 2 (second set: 3)")}),
    # encodes its prompts one by one and reads its batch as `len(...)`
    ("OmDetTurboForObjectDetection", "dynamo",
     {"_patch_omdet_prompts_encoded_at_once": ("torch-export", "data-dependent"),
      "_patch_len_of_tensor_symbolic": ("dynamic-axes", "pixel_values axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


MODULE_CASES = [  # (backend, module, inputs, workaround, error without it)
    ("dynamo", PatchEntropy, {"logits": torch.randn(2, 5, 8)}, "_patch_categorical_unvalidated", "data-dependent"),
]  # fmt: skip


@pytest.mark.parametrize("backend, module, inputs, workaround, error", MODULE_CASES, ids=[c[3] for c in MODULE_CASES])
def test_a_traced_pattern_exports_with_its_workaround_and_fails_without(backend, module, inputs, workaround, error):
    check_pattern_case(backend, module, inputs, workaround, error)


def test_omdet_turbo_program_encodes_the_prompts_it_is_given_not_those_eager_cached():
    context = built_by_the_sweep("OmDetTurboForObjectDetection")  # its eager calls filled the prompt cache
    exported = export_tiny(context, "dynamo")
    other_classes = dict(context.inputs["A"], classes_input_ids=context.inputs["A"]["classes_input_ids"].flip(0))
    with torch.no_grad():
        expected = context.model(**other_classes)
    got = exported(**other_classes)["decoder_class_logits"]
    assert not torch.allclose(got, context.expected["A"]["decoder_class_logits"]), "other classes, other scores"
    torch.testing.assert_close(got, expected.decoder_class_logits, atol=1e-4, rtol=1e-4)


def test_omdet_turbo_prompts_encoded_at_once_are_eagers_per_sample_classes():
    from exporters.dynamo.patches.audio import _patch_omdet_prompts_encoded_at_once

    context = built_by_the_sweep("OmDetTurboForObjectDetection")
    model, inputs = context.model, context.inputs["A"]
    classes_structure = torch.tensor([3, 1, 2])  # samples with more classes than others: padded with zeros
    classes_input_ids = torch.randint(1, 90, (6, inputs["classes_input_ids"].shape[1]))
    prompts = (classes_input_ids, torch.ones_like(classes_input_ids), inputs["tasks_input_ids"][[0, 1, 0]],
               inputs["tasks_attention_mask"][[0, 1, 0]], classes_structure)
    original = type(model).get_language_embedding
    with torch.no_grad():
        one_by_one = original(model, *prompts)
        at_once = _patch_omdet_prompts_encoded_at_once(original)(model, *prompts)
    assert one_by_one[0].shape == (3, 3, model.config.class_embed_dim)
    for got, expected in zip(at_once, one_by_one, strict=True):
        torch.testing.assert_close(got, expected)


def test_omdet_turbo_task_prompts_are_cut_within_the_mask_for_executorch():
    """On a symbolic width: the general count fix bounds the mask's count by the mask's width, but the encoded
    tokens have their own width symbol (two inputs), so `to_edge` still asks whether the count passes it; the patch
    picks the tokens by position instead of slicing them."""
    context = built_by_the_sweep("OmDetTurboForObjectDetection")
    model = TaskPrompts(context.model.language_backbone).eval()

    def prompts(width):
        input_ids = context.inputs["A"]["tasks_input_ids"][:, :1].repeat(1, width)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[:, -2:] = 0  # every prompt two tokens shorter than the batch is wide
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    wide = {name: {1: torch.export.Dim.AUTO} for name in ("input_ids", "attention_mask")}
    exporter, config = exporters.exporter_for("executorch", dynamic=True, dynamic_shapes=wide)
    exported = exporter.export(model, prompts(7), config)
    assert "_patch_omdet_task_prompts_cut_within_the_mask" in exported.applied
    for width in (7, 5):
        with torch.no_grad():
            expected = model(**prompts(width))
        assert expected[1].shape[1] == width - 2
        for got, want in zip(exported(**prompts(width)).values(), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    with disabled_workarounds("_patch_omdet_task_prompts_cut_within_the_mask"):
        with pytest.raises(exporters.ExportError, match=r"u\d+ > s\d+"):
            exporter.export(model, prompts(7), config)


def test_esmfold_traces_with_a_symbolic_batch_once_its_identity_frames_are_made_afresh():
    context = built_by_the_sweep("EsmForProteinFolding")
    exported = export_tiny(context, "dynamo", dynamic=True)
    assert "_patch_identity_frames_uncached" in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE["dynamo"])
    with disabled_workarounds("_patch_identity_frames_uncached"):
        with pytest.raises(exporters.ExportError, match="unhashable"):
            export_tiny(context, "dynamo", dynamic=True)


def test_the_gathered_length_regulator_repeats_like_the_loop():
    from transformers.models.fastspeech2_conformer import modeling_fastspeech2_conformer as fastspeech2

    from exporters.dynamo.patches.audio import _patch_length_regulator_gathered

    gathered = _patch_length_regulator_gathered(fastspeech2.length_regulator)
    embeddings = torch.randn(3, 4, 5)
    for durations in ([[1, 0, 2, 3], [0, 0, 0, 0], [2, 2, 1, 0]], [[0, 0, 0, 0]] * 3, [[3, 1, 0, 2]] * 3):
        durations = torch.tensor(durations)  # the loop sets the durations of silent rows in place
        assert torch.equal(gathered(embeddings, durations.clone()), fastspeech2.length_regulator(embeddings, durations))


def test_seamless_m4t_vocoder_units_repeated_at_once_are_eagers_sample_by_sample():
    from exporters.dynamo.patches.audio import _patch_seamless_m4t_units_repeated_at_once

    context = built_by_the_sweep("SeamlessM4TCodeHifiGan")
    model, inputs = context.model, context.inputs["A"]
    model.dur_predictor.proj.weight.data *= 10  # units of 1 to a few frames: rows of unequal lengths, padded
    original = type(model).forward
    at_once = _patch_seamless_m4t_units_repeated_at_once(original)
    generator = torch.Generator().manual_seed(0)
    for batch, length in ((1, 6), (2, 4), (3, 9)):  # one sample takes eager's other branch
        units = torch.randint(4, model.config.unit_hifi_gan_vocab_size, (batch, length), generator=generator)
        speakers, languages = inputs["spkr_id"][:1].expand(batch, -1), inputs["lang_id"][:1].expand(batch, -1)
        with torch.no_grad():
            expected, got = (forward(model, units, speakers, languages) for forward in (original, at_once))
        for value, reference in zip(got, expected, strict=True):
            torch.testing.assert_close(value, reference)
