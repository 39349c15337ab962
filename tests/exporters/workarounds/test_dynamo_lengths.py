"""The Dynamo model patches of `exporters/dynamo/patches/lengths.py` (lengths and sizes read as Python numbers): each
passes with its workaround and fails, or differs from eager, without it.
"""

import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import exporters
from exporters.registration import apply_patches
from exporters.workarounds import disabled_workarounds

from .modules import (
    ByteGroupHashes,
    built_by_the_sweep,
    check_class_case,
    check_dynamic_cell_case,
    exported_on_the_varying_axes,
    fixed_axes_with_and_without,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    # its units repeated by predicted durations, then padded to the longest: lengths read from data
    ("SeamlessM4TCodeHifiGan", "onnx", "_patch_pad_sequence_to_symbolic_longest", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # exported with 2 images of 16 patches, run with 3: the window-ordered rows were planned for 32
    ("Qwen2_5_VLModel", "executorch", {"_patch_window_order_sized_by_the_index": ("run", "0x12")}),
    # Qwen3-Omni's code predictor: head `length - 2` of a list of linears
    ("Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration", "dynamo",
     {"_patch_linear_picked_by_a_symbolic_index": ("dynamic-axes", "inputs_embeds axis 1 = 7 (second set: 5)")}),
    # LFM3 (kernel 7) exported on a 7-token prompt meets a 5-token one, which eager pads
    ("Lfm3Model", "dynamo",
     {"_patch_conv_state_padded_to_its_kernel_always": ("run", "Guard failed: input_ids.size()[1] >= 7")}),
    # and on ONNX, which runs no guard: the 5-token prompt went through the branch of the 7-token one (with the patch,
    # contiguity asked of its padded state, `length + Max(0, 7 - length)`, had guarded that equal to 7)
    ("Lfm3Model", "onnx", {"_patch_conv_state_padded_to_its_kernel_always": ("parity", "outputs differ from eager")}),
    ("EncodecModel", "dynamo",
     {"_patch_encodec_one_chunk_as_one_offset": ("dynamic-axes", "input_values axis 2 = 8000")}),
    # without it the guard on the conv lengths is one sympy cannot solve (torch.export then fails whole)
    ("XcodecModel", "dynamo", {"_patch_conv1d_output_length_floor_divided": ("torch-export",
                                                                           "solve_univariate_inequality")}),
    # lists its chunks with a Python range up to the frame count
    ("Nemotron3DiarizationForAudioFrameClassification", "dynamo",
     {"_patch_nemotron_audio_of_one_chunk": ("run", "Guard failed")}),
    # walks its list of series one by one
    ("TimesFmModelForPrediction", "dynamo",
     {"_patch_timesfm_series_as_one_batch": ("dynamic-axes", "past_values axis 0 = 2 (second set: 3)")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


def test_blt_hashes_the_same_byte_groups_by_gather_and_keeps_its_length_symbolic():
    from transformers.models.blt import modeling_blt

    from exporters.dynamo.patches.lengths import _patch_blt_byte_groups_gathered

    original = modeling_blt.byte_group_hash_function
    gathered = _patch_blt_byte_groups_gathered(original)
    tokens = torch.randint(0, 260, (3, 9))
    for group_size in (2, 3, 8, 12):  # a group longer than the input too
        assert torch.equal(gathered(tokens, group_size, 1500450271, 500), original(tokens, group_size, 1500450271, 500))
    fixed = fixed_axes_with_and_without("BltModel", ["_patch_blt_byte_groups_gathered"])
    assert fixed == {"_patch_blt_byte_groups_gathered": [
        "input_ids axis 1 = 7 (second set: 5)", "attention_mask axis 1 = 7 (second set: 5)"]}


def test_blt_hashes_wrap_around_int64_on_onnx_runtime_as_in_torch():
    """Powers of a prime near 1e9 past the second, and their weighted sums, overflow int64: torch wraps them, ONNX
    Runtime's integer Pow and ReduceSum do not (BLT's ONNX logits were 4.3 off)."""
    model, tokens = ByteGroupHashes(), torch.randint(0, 260, (2, 9))
    exporter, config = exporters.exporter_for("onnx")
    (hashes,) = exporter.export(model, {"token_ids": tokens}, config)(token_ids=tokens).values()
    assert torch.equal(torch.as_tensor(hashes), model(tokens))
    with disabled_workarounds("_patch_blt_byte_groups_gathered"):
        (hashes,) = exporter.export(model, {"token_ids": tokens}, config)(token_ids=tokens).values()
    assert (torch.as_tensor(hashes) != model(tokens)).float().mean() > 0.5


def test_the_gathered_window_order_is_the_reshaped_one():
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

    from exporters.dynamo.patches.lengths import _patch_window_order_sized_by_the_index

    tower = types.SimpleNamespace(spatial_merge_unit=4)
    rows, window_index = torch.randn(24, 5), torch.randperm(6)
    gathered = _patch_window_order_sized_by_the_index(None)(tower, rows, window_index, 24)
    assert torch.equal(gathered, Tower.permute_input_for_window_attn(tower, rows, window_index, 24))


@pytest.mark.parametrize("name, count_inputs", [
    ("Qwen3VLModel", ["image_grid_thw"]),  # per image, its deepstack features too
    ("Idefics3Model", ["pixel_values", "pixel_attention_mask"]),  # per sample
])  # fmt: skip
def test_the_image_count_stays_symbolic_where_features_are_split_per_image(name, count_inputs):
    split, fake_tolist = torch.Tensor.split, FakeTensor.tolist
    fixed = fixed_axes_with_and_without(name, ["_patch_image_features_split_kept_whole"])
    assert sorted(fixed["_patch_image_features_split_kept_whole"]) == [
        f"{count_input} axis 0 = 2 (second set: 3)" for count_input in sorted(count_inputs)]
    # the tensor methods it replaces for the call are as they were
    assert "tolist" not in vars(torch.Tensor) and (torch.Tensor.split, FakeTensor.tolist) == (split, fake_tolist)


def test_csm_depth_decoder_keeps_a_symbolic_length_under_its_per_position_heads():
    fixed = fixed_axes_with_and_without("CsmDepthDecoderForCausalLM", ["_patch_csm_codebook_heads_as_one_product"])
    assert "input_ids axis 1 = 7 (second set: 5)" in fixed["_patch_csm_codebook_heads_as_one_product"]


def test_cpmant_padding_mask_by_arange_is_the_listed_one():
    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    from exporters.dynamo.patches.lengths import _patch_cpmant_padding_mask_by_arange

    model = built_by_the_sweep("CpmAntModel").model
    by_arange = _patch_cpmant_padding_mask_by_arange(CpmAntModel._prepare_attention_mask)
    for seqlen in (model.prompt_length + 1, model.prompt_length + 6):
        input_ids = torch.zeros(3, seqlen, dtype=torch.long)
        context = torch.rand(3, seqlen) > 0.5
        span = (torch.rand(3, seqlen) > 0.8).cumsum(-1)
        length = torch.tensor([0, 1, seqlen - model.prompt_length])  # all padding, one real token, none
        expected = CpmAntModel._prepare_attention_mask(model, input_ids, span, context, length)
        assert torch.equal(by_arange(model, input_ids, span, context, length), expected)
    fixed = fixed_axes_with_and_without("CpmAntModel", ["_patch_cpmant_padding_mask_by_arange"])
    assert "input_ids axis 1 = 7 (second set: 5)" in fixed["_patch_cpmant_padding_mask_by_arange"]


@pytest.mark.parametrize("name, workaround, guarded", [
    # Moonshine's decoder passes `is_causal=False` whenever it is handed a mask: a causal module all the same
    pytest.param("MoonshineModel", "_patch_moonshine_conv_lengths_floor_divided", "attention_mask", id="MoonshineModel"),
    pytest.param("NeuCodecModel", "_patch_neucodec_output_length_in_integers", "input_values", id="NeuCodecModel"),
    # SEW's upsampling, whatever the parity of its length
    pytest.param("SEWModel", "_patch_sew_upsampled_to_its_input_length", "input_values", id="SEWModel"),
    pytest.param("SEWDModel", "_patch_sew_upsampled_to_its_input_length", "input_values", id="SEWDModel"),
])  # fmt: skip
def test_an_audio_length_stays_symbolic(name, workaround, guarded):
    context, _, export = exported_on_the_varying_axes(name, [workaround])
    with disabled_workarounds(workaround):
        fixed_length = export()
    with pytest.raises(Exception, match=f"Guard failed: .*{guarded}"):
        fixed_length(**context.inputs["B"])


def test_vits_pads_its_relative_positions_for_any_text_length():
    # exported on a text longer than the window (padded), matches eager on one that fits it (not padded)
    context, _, export = exported_on_the_varying_axes("VitsModel", ["_patch_vits_relative_embeddings_padded_always"])
    window = next(module.window_size for module in context.model.modules() if hasattr(module, "window_size"))
    assert context.inputs["B"]["input_ids"].shape[1] <= window + 1 < context.inputs["A"]["input_ids"].shape[1]
    with disabled_workarounds("_patch_vits_relative_embeddings_padded_always"):
        branched = export()
    with pytest.raises(Exception, match="Guard failed: .*attention_mask"):  # the second text fits the window
        branched(**context.inputs["B"])


def test_forecast_masking_of_one_length_is_the_grouped_one():
    from transformers.models.patchtst.modeling_patchtst import forecast_masking

    from exporters.dynamo.patches.lengths import _patch_forecast_masking_of_one_length

    by_comparison = _patch_forecast_masking_of_one_length(forecast_masking)
    inputs = torch.randn(5, 3, 8, 4)
    for unmasked_channels in (None, [1]):
        expected = forecast_masking(inputs, 3, unmasked_channels, mask_value=-1)
        for actual, wanted in zip(by_comparison(inputs, [3], unmasked_channels, mask_value=-1), expected):
            assert torch.equal(actual, wanted)
    fixed = fixed_axes_with_and_without("PatchTSTForPretraining", ["_patch_forecast_masking_of_one_length"])
    assert fixed["_patch_forecast_masking_of_one_length"] == ["past_values axis 0 = 2 (second set: 3)"]


def test_music_flamingo_keeps_a_symbolic_batch_of_clips():
    name = "_patch_music_flamingo_rows_before_by_subtraction"
    fixed = fixed_axes_with_and_without("MusicFlamingoModel", [name])
    clips = ("input_features", "input_features_mask")
    assert sorted(fixed[name]) == [f"{axis} axis 0 = 2 (second set: 3)" for axis in clips]


@pytest.mark.parametrize("name", ["TimesFmModelForPrediction", "TimesFm2_5ModelForPrediction"])
def test_timesfm_series_as_one_batch_forecast_like_eager_series_by_series(name):

    model = built_by_the_sweep(name).model
    context = model.context_len
    # padded in front; as they are; longer than TimesFM's own context, which its padding cuts them to
    longer = context + model.config.patch_length  # TimesFM 2.5 patches its context: a whole number of patches
    for length, forecast_context in ((context - 5, None), (context, None), (longer, longer)):
        past_values = torch.randn(3, length, generator=torch.Generator().manual_seed(length))
        options = {"forecast_context_len": forecast_context}
        with torch.no_grad():
            by_series = exporters.named_leaves(model(past_values=list(past_values), **options))
            with apply_patches("dynamo", select=lambda path: ".modeling_timesfm" in path):
                at_once = exporters.named_leaves(model(past_values=past_values, **options))
        assert at_once.keys() == by_series.keys()
        for output in by_series:
            torch.testing.assert_close(at_once[output], by_series[output], msg=f"{length}: {output}")
