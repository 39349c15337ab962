"""The Dynamo model patches of `exporters/dynamo/patches/audio_windows.py` (audio windows and chunks and their
neighbours): each passes with its workaround and fails, or differs from eager, without it.
"""

import pytest
import torch

import exporters

from ..conftest import TOLERANCE, assert_parity
from .modules import (
    AudioFeatures,
    built_by_the_sweep,
    check_class_case,
    check_dynamic_cell_case,
    export_module,
    fixed_axes_with_and_without,
)


CLASS_CASES = [  # (model class, tiny as the sweep builds it, backend, workaround, error without it)
    # a greedy decode that breaks once every row has ended
    ("SLANetSLAHead", "dynamo", "_patch_table_decode_cut_after", "data-dependent"),
    # its audio tower's attention windows, cut in a loop over lengths read from the mask
    ("Qwen3ASRModel", "dynamo", "_patch_audio_windows_padded", "data-dependent"),
    # its conformer's streaming mask finds each frame's chunk with nonzero
    ("Phi4MultimodalAudioModel", "dynamo", "_patch_streaming_mask_by_argmax", "data-dependent"),
]


@pytest.mark.parametrize("name, backend, workaround, error", CLASS_CASES, ids=[case[2] for case in CLASS_CASES])
def test_a_model_class_exports_with_its_workaround_and_fails_without(name, backend, workaround, error):
    check_class_case(name, backend, workaround, error)


DYNAMIC_CELL_CASES = [  # (model class, backend, {workaround: (stage, message) of its dynamic cell without it})
    # splits its kept audio frames into chunks by sizes read with `.tolist()`
    ("Qwen2_5OmniThinkerModel", "dynamo", {"_patch_omni_audio_chunks_on_a_grid": ("torch-export", "data-dependent")}),
    # reads its token grid's height and width back from a tensor in every decoder layer
    ("Sam3LiteTextModel", "dynamo", {"_patch_sam3_box_bias_on_the_token_grid": ("torch-export", "data-dependent")}),
]  # fmt: skip


@pytest.mark.parametrize("name, backend, failures", DYNAMIC_CELL_CASES, ids=[case[0] for case in DYNAMIC_CELL_CASES])
def test_a_dynamic_cell_passes_with_its_workarounds_and_fails_without_each(name, backend, failures):
    check_dynamic_cell_case(name, backend, failures)


def test_canine_keeps_a_symbolic_length_through_its_local_attention_and_mask_pooling():
    workarounds = ["_patch_canine_local_attention_masked", "_patch_max_pool1d_by_windows"]
    fixed = fixed_axes_with_and_without("CanineModel", workarounds)
    for workaround in workarounds:
        assert "input_ids axis 1 = 7 (second set: 5)" in fixed[workaround], workaround


def test_canine_local_attention_as_one_masked_attention_is_the_windowed_one():
    from transformers import CanineConfig
    from transformers.models.canine.modeling_canine import CanineAttention

    from exporters.dynamo.patches.audio_windows import _patch_canine_local_attention_masked

    torch.manual_seed(0)
    config = CanineConfig(hidden_size=16, num_attention_heads=2)
    masked_forward = _patch_canine_local_attention_masked(CanineAttention.forward)
    for always_attend_to_first_position in (False, True):
        attention = CanineAttention(
            config, local=True, always_attend_to_first_position=always_attend_to_first_position,
            attend_from_chunk_width=3, attend_from_chunk_stride=3, attend_to_chunk_width=3, attend_to_chunk_stride=3,
        ).eval()  # fmt: skip
        hidden = torch.randn(2, 8, 16)  # three windows, the last one short
        padding = torch.ones(2, 8, 8)
        padding[1, :, 6:] = 0  # the second text ends inside the last window...
        padding[1, :, 3:6] = 0  # ...and a whole window of it is padding: its queries read padding only
        with torch.no_grad():
            expected = attention(hidden, padding)[0]
            got = masked_forward(attention, hidden, padding)[0]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("end_bias, steps", [(0.0, 9), (100.0, 1)])  # no row ends; every row ends at once
def test_table_decode_is_cut_where_eager_stops(end_bias, steps):
    context = built_by_the_sweep("SLANetSLAHead")
    model, inputs = context.model, context.inputs["A"]
    model.structure_generator.fc2.bias.data[-1] += end_bias  # the last class is the end token
    expected = context._forward(inputs)
    assert expected["last_hidden_state"].shape[1] == steps
    assert_parity(export_module(model, inputs, "dynamo")(**inputs), expected, TOLERANCE["dynamo"])


@pytest.mark.parametrize("module", ["qwen3_asr", "qwen3_omni_moe"])
def test_padded_audio_windows_split_the_frames_as_the_loop_does(module):
    import importlib

    from exporters.dynamo.patches.audio_windows import _patch_audio_windows_padded

    looped = importlib.import_module(f"transformers.models.{module}.modeling_{module}").get_audio_cu_seqlens
    padded = _patch_audio_windows_padded(looped)
    n_window, n_window_infer, chunk = 4, 32, 8  # windows of 4 chunks
    for frames in ([64, 40, 9], [8, 8], [33, 64, 1, 17]):
        chunks = -(-max(frames) // chunk)
        mask = torch.tensor([[1] * length + [0] * (chunks * chunk - length) for length in frames])
        chunk_lengths, feature_lens = mask.view(len(frames), chunks, chunk).sum(-1).flatten(), mask.sum(-1)
        boundaries = [f(chunk_lengths, feature_lens, n_window_infer, n_window) for f in (looped, padded)]
        assert boundaries[0][-1] == boundaries[1][-1]
        positions = torch.arange(int(boundaries[0][-1]))
        same_window = [(s := (positions[:, None] >= b[None, 1:]).sum(-1))[:, None] == s[None] for b in boundaries]
        assert torch.equal(*same_window)
        assert len(boundaries[1]) == len(frames) * len(chunk_lengths) + 1  # a count the frames do not decide


def test_phi4_streaming_mask_by_argmax_matches_the_nonzero_one():
    import numpy as np
    from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4

    from exporters.dynamo.patches.audio_windows import _patch_streaming_mask_by_argmax

    by_argmax = _patch_streaming_mask_by_argmax(phi4.adaptive_enc_mask)
    for frames, chunk, left, right in ((20, 6, 1, 0), (20, 6, 0, 1), (18, 4, 18, 0), (7, 7, 2, 2)):
        starts = np.arange(0, frames, chunk)
        assert torch.equal(by_argmax(frames, starts, left, right), phi4.adaptive_enc_mask(frames, starts, left, right))
    streaming = _patch_streaming_mask_by_argmax(phi4.Phi4MultimodalAudioModel._streaming_mask)
    model = built_by_the_sweep("Phi4MultimodalAudioModel").model
    for chunk in (-1, 4):  # -1: the whole sequence is one chunk
        expected = phi4.Phi4MultimodalAudioModel._streaming_mask(model, 13, 2, chunk, 1)
        assert torch.equal(streaming(model, 13, 2, chunk, 1), expected)


def test_phi4_streaming_mask_keeps_a_symbolic_frame_count_free():
    """The chunk ends were padded with `pad(value=frames)` and clamped by `len()`: both fixed the program's frame
    count at its traced value, and a longer audio was refused."""
    from transformers.models.phi4_multimodal import modeling_phi4_multimodal as phi4

    from exporters.dynamo.patches.audio_windows import _patch_streaming_mask_by_argmax

    by_argmax = _patch_streaming_mask_by_argmax(phi4.adaptive_enc_mask)

    class ChunkMask(torch.nn.Module):
        def forward(self, features):
            frames = features.shape[1]
            return by_argmax(frames, torch.arange(0, frames, 4), 1, 0)

    program = torch.export.export(ChunkMask(), (torch.randn(2, 10),), dynamic_shapes=({1: torch.export.Dim.AUTO},))
    for frames in (10, 13):
        starts = torch.arange(0, frames, 4).numpy()
        assert torch.equal(program.module()(torch.randn(2, frames)), phi4.adaptive_enc_mask(frames, starts, 1, 0))


@pytest.mark.parametrize("name", ["Qwen2_5OmniThinkerModel", "Qwen3OmniMoeThinkerModel"])
def test_omni_audio_chunks_on_a_grid_are_eagers_chunks(name):
    from exporters.dynamo.patches.audio_windows import _patch_omni_audio_chunks_on_a_grid
    from exporters.dynamo.patches.attention import segmented_attention

    model = built_by_the_sweep(name).model
    tower = model.audio_tower
    width = 2 * tower.n_window
    frames = 3 * width - 5  # the last chunk of a full sample is short
    kept = torch.arange(frames)[None] < torch.tensor([frames, width + 3, width, 7])[:, None]
    holed = torch.arange(frames) % 3 != 1  # a mask that keeps frames past dropped ones
    masks = torch.cat([kept, holed[None]]).long()
    features = torch.randn(len(masks), tower.num_mel_bins, frames)
    features.transpose(1, 2)[masks == 0] = float("nan")  # dropped frames must not reach the chunks
    original = type(model).get_audio_features
    with torch.no_grad():
        chunk_by_chunk = original(model, features, masks)
        with segmented_attention(model, set()):  # as exported: a chunk past a sample's frames attends to nothing
            on_a_grid = _patch_omni_audio_chunks_on_a_grid(original)(model, features, masks)
    torch.testing.assert_close(on_a_grid.last_hidden_state, chunk_by_chunk.last_hidden_state)


def test_executorch_plans_memory_for_the_omni_audio_pairs():
    """Qwen2.5-Omni averages its audio positions in pairs, counted from the data: bounded by the frames given."""
    thinker = built_by_the_sweep("Qwen2_5OmniThinkerModel").model
    model, bins = AudioFeatures(thinker).eval(), thinker.audio_tower.num_mel_bins

    def inputs(lengths, frames):
        return {"input_features": torch.randn(len(lengths), bins, frames),
                "feature_attention_mask": (torch.arange(frames) < torch.tensor(lengths)[:, None]).long()}

    exporter, config = exporters.exporter_for("executorch", dynamic=True)
    exported = exporter.export(model, inputs([30, 17], 30), config)
    assert "_patch_omni_audio_chunks_on_a_grid" in exported.applied
    other = inputs([41, 9, 26], 41)
    with torch.no_grad():
        expected = model(**other)
    (features,) = exported(**other).values()
    torch.testing.assert_close(features, expected, atol=TOLERANCE["executorch"], rtol=TOLERANCE["executorch"])
