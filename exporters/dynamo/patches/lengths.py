"""Stage 2 model patches: a length or size the model reads as a Python number: ranges and chunk lists over it, paddings
taken only when needed, per-image splits and window orders by sizes read from data, output lengths computed in
floats, a head picked by a symbolic index, sequences padded to a symbolic longest, a decode step's position cast by
`int()`.
"""

from __future__ import annotations

import functools
import inspect
import sys
from contextlib import contextmanager

import torch

from ...registration import register_patch, report_applied


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "transformers.models.esm.modeling_esmfold.range", reports=True,
    model_side="EsmForProteinFolding.forward (modeling_esmfold) writes the end-of-sequence tokens with "
               "`esmaa[torch.arange(B, device=esmaa.device), ends] = eosi` instead of indexing with Python "
               "`range(B)`.",
)
def _patch_range_of_symbolic_batch_as_arange(original):
    """ESMFold marks each sequence's end with `esmaa[range(B), ends] = eos`: Python's `range` takes an int, which
    fixes a dynamic batch to the traced one. As an index, `arange(B)` selects the same rows and keeps B symbolic."""

    def symbolic_range(*args):
        if len(args) != 1 or not isinstance(args[0], torch.SymInt):
            return original(*args)
        report_applied()
        return torch.arange(args[0])

    return symbolic_range


@register_patch(
    "dynamo", "transformers.models.encodec.modeling_encodec.range", reports=True,
    model_side="EncodecModel.encode skips the Python `range(0, input_length, stride)` chunk loop when "
               "config.chunk_length is None and encodes the whole input as the single chunk at offset 0.",
)
def _patch_encodec_one_chunk_as_one_offset(original):
    """Without a chunk length, Encodec encodes its whole input as one chunk, listed as `range(0, length, length)`:
    Python's `range` takes ints, which fixes a symbolic length. That range is the one offset 0."""

    def chunk_offsets(*args):
        if len(args) == 3 and isinstance(args[1], torch.SymInt) and args[0] == 0 and args[2] is args[1]:
            report_applied()
            return [0]
        return original(*args)

    return chunk_offsets


@register_patch(
    "dynamo", "transformers.models.nemotron3_diarization.modeling_nemotron3_diarization.range",
    "transformers.models.nemotron3_5_transcribe.modeling_nemotron3_5_transcribe.range", reports=True,
    model_side="Nemotron3DiarizationModel.forward and Nemotron3_5Transcribe's _get_chunks handle input that fits"
               " in one chunk without iterating Python `range(start, num_frames, chunk_length)` over the "
               "symbolic frame count (or chunk with tensor ops, e.g. a block-diagonal chunk attention mask).",
)
def _patch_nemotron_audio_of_one_chunk(original):
    """Nemotron's audio models encode long audio in chunks of `chunk_length` frames, listed by
    `range(start, frames, chunk_length)`: Python's `range` takes ints, which fixes a symbolic frame count. A program
    for audio of up to one chunk (27 s for the diarizer, 40 s for the transcriber) lists that one chunk and refuses
    longer audio at run time (the diarizer's speaker cache bounds it lower still, by its queue of 40 frames: 3 s)."""

    def chunk_starts(*args):
        if len(args) != 3 or not isinstance(args[1], torch.SymInt) or isinstance(args[0], torch.SymInt):
            return original(*args)
        report_applied()
        start, stop, step = args
        torch._check(stop - start <= step, lambda: f"audio of more than one chunk ({step} frames)")
        torch._check(stop > start)
        return [start]

    return chunk_starts


_TIMESFM = (("timesfm", "TimesFmModelForPrediction"), ("timesfm2_5", "TimesFm2_5ModelForPrediction"))


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.forward"
    for module, model in _TIMESFM), reports=True,
    upstream="https://github.com/huggingface/transformers/pull/45233",
)
def _patch_timesfm_series_as_one_batch(original):
    """TimesFM takes a list of series of any lengths and walks it series by series (their last context, their
    minimum, their padding): a batch tensor walked so fixes its size. Series of one length, handed over as one
    time-major tensor, go through that walk once, and `_patch_timesfm_batch_padded_at_once` pads them together."""

    def forward(self, past_values, *args, **kwargs):
        batched = isinstance(past_values, torch.Tensor) and past_values.dim() == 2
        if not batched or args or kwargs.get("window_size") is not None:  # a decomposition doubles the series
            return original(self, past_values, *args, **kwargs)
        report_applied()
        return original(self, [past_values.T], **kwargs)

    return forward


@register_patch(
    "dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}._preprocess"
    for module, model in _TIMESFM),
    upstream="https://github.com/huggingface/transformers/pull/45233",
)
def _patch_timesfm_batch_padded_at_once(original):
    """TimesFM's padding of `_patch_timesfm_series_as_one_batch`'s time-major batch, series by series as eager pads
    each: front zeros up to the context, or the context's last values, and the padding mask."""

    def _preprocess(self, inputs, freq=None, context_len=None):
        if len(inputs) != 1 or inputs[0].dim() != 2:
            return original(self, inputs, freq, context_len)
        context_len = context_len or self.context_len
        series = inputs[0].T  # (batch, length)
        padding = series.new_zeros(series.shape[0], series.shape[1] + self.horizon_len)
        if series.shape[1] < context_len:
            front = context_len - series.shape[1]
            series = torch.nn.functional.pad(series, (front, 0))
            padding = torch.nn.functional.pad(padding, (front, 0), value=1.0)
        elif series.shape[1] > context_len:
            series, padding = series[:, -context_len:], padding[:, -(context_len + self.horizon_len):]
        if freq is None:
            return series, padding
        frequencies = torch.as_tensor(freq, dtype=torch.int32, device=series.device).reshape(-1, 1)
        return series, padding, frequencies.expand(series.shape[0], 1)

    return _preprocess


@register_patch(
    "dynamo", "transformers.models.blt.modeling_blt.byte_group_hash_function",
    model_side="BltModel's byte_group_hash_function reads each n-gram window with one gather at computed indices"
               " (no `unfold` over the symbolic length) and weighs the bytes with int64-wrapped prime powers "
               "precomputed in Python and summed term by term, instead of `prime ** arange` and `.sum()` (which "
               "ONNX Runtime's integer Pow/ReduceSum compute via doubles / with saturation).",
)
def _patch_blt_byte_groups_gathered(_original):
    """BLT hashes the byte n-grams ending at each position from `unfold` windows over the input padded in front.
    `unfold` on a symbolic length guards that the length holds a window, once per n-gram size, and the export came
    out with a fixed length; the same windows read by one gather at computed indices. The hash weighs the bytes by
    powers of a prime near 1e9, which wrap around int64 past the second: ONNX Runtime's integer `Pow` goes through
    doubles (1e18 lost its last digits, wrapped powers came out as INT64_MIN) and the hashes picked other
    embeddings; its integer `ReduceSum` saturates where torch wraps. The group size is known when traced: its
    powers are constants wrapped as torch wraps them, and the weighted bytes are added one by one (`Add` wraps)."""

    def wrapped_powers(prime, count):
        powers = [pow(prime, exponent, 1 << 64) for exponent in range(count)]
        return [power - (1 << 64) if power >= 1 << 63 else power for power in powers]

    def byte_group_hash_function(token_ids, group_size=2, prime=1000000007, max_hash=30000):
        with torch.no_grad():
            padding = token_ids.new_zeros(token_ids.shape[0], group_size - 1, dtype=torch.int64)
            padded = torch.cat([padding, token_ids], dim=1)
            starts = torch.arange(token_ids.shape[1], device=token_ids.device)
            windows = padded[:, starts[:, None] + torch.arange(group_size, device=token_ids.device)]
            weighted = windows * torch.tensor(wrapped_powers(prime, group_size), device=token_ids.device)
            return sum(weighted.unbind(-1)) % max_hash

    return byte_group_hash_function


@register_patch(
    "dynamo", "transformers.models.vits.modeling_vits.VitsAttention._get_relative_embeddings", reports=True,
    model_side="VitsAttention._get_relative_embeddings pads its relative-position table by max(length - "
               "(window_size + 1), 0) unconditionally instead of branching on `if pad_length > 0`.",
)
def _patch_vits_relative_embeddings_padded_always(original):
    """VITS pads its relative-position table only when the text is longer than its window (`if pad_length > 0`), a
    branch on the length the program then guards on. Padding by zero changes nothing, so it pads always, by the
    symbolic amount."""

    def get_relative_embeddings(self, relative_embeddings, length):
        if not isinstance(length, torch.SymInt):
            return original(self, relative_embeddings, length)
        report_applied()
        pad_length = torch.sym_max(length - (self.window_size + 1), 0)
        padded = torch.nn.functional.pad(relative_embeddings, [0, 0, pad_length, pad_length, 0, 0])
        start = torch.sym_max((self.window_size + 1) - length, 0)
        return padded[:, start : start + 2 * length - 1]

    return get_relative_embeddings


@register_patch(
    "dynamo", "transformers.cache_utils.LinearAttentionLayer.update_conv_state", reports=True,
    model_side="transformers' LinearAttentionLayer.update_conv_state (cache_utils) pads the prefill conv states "
               "by max(conv_kernel_size - length, 0) unconditionally instead of branching on `if "
               "full_conv_states.shape[-1] < conv_kernel_size`.",
)
def _patch_conv_state_padded_to_its_kernel_always(original):
    """A hybrid model's first pass pads its convolution states to the kernel only when the prompt is shorter than
    the kernel, a branch on the length the program then guards on (LFM3, kernel 7 here: a 5-token prompt failed the
    guard). Padding by max(kernel - length, 0) is the same tensor either way, so it pads always."""

    def update_conv_state(self, conv_states, state_idx=0, conv_kernel_size=None, **kwargs):
        length = conv_states.shape[-1]
        if not isinstance(length, torch.SymInt) or self.record_past or self.has_previous_state[state_idx]:
            return original(self, conv_states, state_idx, conv_kernel_size, **kwargs)
        report_applied()
        if not self.is_conv_states_initialized[state_idx]:
            self.lazy_initialization(conv_states=conv_states, state_idx=state_idx, conv_kernel_size=conv_kernel_size)
        missing = torch.sym_max(self.conv_kernel_size[state_idx] - length, 0)
        padded = torch.nn.functional.pad(conv_states, (missing, 0))
        return original(self, padded, state_idx, conv_kernel_size, **kwargs)

    return update_conv_state


class WholeSplit:
    """Per-image sizes read from a tensor of symbolic length: a split by them is taken whole, and code that knows this
    marker reads the sizes from `tensor`."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __iter__(self):
        raise TypeError("per-image sizes were kept symbolic for the export; only a split or a patch can take them")


@contextmanager
def _split_taken_whole(caller):
    """While it lasts, ``tensor.tolist()`` called by ``caller``'s own code on a tensor of symbolic length gives a
    `WholeSplit`, and a split by it gives the tensor whole, as a one-part tuple."""
    from torch._subclasses.fake_tensor import FakeTensor  # the trace's tensors, with a `tolist` of their own

    caller_code = inspect.unwrap(caller).__code__
    own_tolists = {cls: vars(cls).get("tolist") for cls in (torch.Tensor, FakeTensor)}  # None: inherited
    tolist_of = {cls: cls.tolist for cls in own_tolists}
    split = torch.Tensor.split

    def deferred_tolist(self):
        if sys._getframe(1).f_code is caller_code and self.dim() and isinstance(self.shape[0], torch.SymInt):
            report_applied()
            return WholeSplit(self)
        return tolist_of[FakeTensor if isinstance(self, FakeTensor) else torch.Tensor](self)

    def whole_split(self, split_size, dim=0):
        return (self,) if isinstance(split_size, WholeSplit) else split(self, split_size, dim)

    for cls in own_tolists:
        cls.tolist = deferred_tolist
    torch.Tensor.split = whole_split
    try:
        yield
    finally:
        for cls, own in own_tolists.items():
            if own is None:
                delattr(cls, "tolist")
            else:
                cls.tolist = own
        torch.Tensor.split = split


@register_patch(
    "dynamo",
    *(f"transformers.models.{module}.modeling_{module}.{model}.get_image_features" for module, model in (
    ("qwen2_vl", "Qwen2VLModel"), ("qwen2_5_vl", "Qwen2_5_VLModel"), ("qwen3_vl", "Qwen3VLModel"),
    ("qwen3_vl_moe", "Qwen3VLMoeModel"), ("qwen3_5", "Qwen3_5Model"), ("qwen3_5_moe", "Qwen3_5MoeModel"),
    ("qwen4_exp", "Qwen4ExpModel"), ("glm4v", "Glm4vModel"), ("glm4v_moe", "Glm4vMoeModel"),
    ("glm46v", "Glm46VModel"), ("glm5_next", "Glm5NextModel"), ("glm_ocr", "GlmOcrModel"),
    ("exaone4_5", "Exaone4_5_Model"), ("cohere_compass", "CohereCompassModel"),
    ("cosmos3_omni", "Cosmos3OmniModel"), ("dots3_note", "Dots3NoteModel"),
    ("hyperclovax_vision_v2", "HyperCLOVAXVisionV2Model"), ("idefics2", "Idefics2Model"),
    ("idefics3", "Idefics3Model"), ("smolvlm", "SmolVLMModel"), ("granite_docling", "GraniteDoclingModel"),
    ("modernvbert", "ModernVBertModel"), ("ultravbert", "UltraVBertModel"), ("mistral3", "Mistral3Model"),
    ("mistral_large4", "MistralLarge4Model"), ("muse_spark", "MuseSparkModel"),
    ("muse_glimmer", "MuseGlimmerModel"), ("kimi_k25", "Kimi_K25Model"),
    ("paddleocr_vl", "PaddleOCRVLModel"), ("lfm3_vl", "Lfm3VlModel"), ("molmo2", "Molmo2Model"),
    ("minimax_m3_vl", "MiniMaxM3VLModel"), ("cosmos3_edge", "Cosmos3EdgeModel"),
    ("ernie4_5_vl_moe", "Ernie4_5_VLMoeModel"), ("video_llama_3", "VideoLlama3Model"),
    ("inkling2", "Inkling2Model"), ("hunyuan_vl", "HunYuanVLModel"), ("qwen2_5_omni", "Qwen2_5OmniThinkerModel"),
    ("qwen3_omni_moe", "Qwen3OmniMoeThinkerModel"))),
    "transformers.models.lfm3_vl.modeling_lfm3_vl.Lfm3VlVisionModel.forward",  # its grid, to its convolutions
    reports=True,
    model_side="The Qwen-VL-style (Qwen2VLModel.get_image_features and copies) and Idefics-style "
               "get_image_features return the packed image features as one tensor (with per-image sizes "
               "alongside) instead of `torch.split(features, sizes.tolist())` / per-sample lists that forward "
               "concatenates right back.",
)
def _patch_image_features_split_kept_whole(original):
    """Qwen-VL-style models split their packed image features into one tensor per image by sizes read from the
    grid (`.tolist()`), Idefics-style ones per sample by its count of real images, and their forward concatenates
    the parts again. A Python list needs a length, so the image count (the batch) was fixed. With that count
    symbolic, the split is taken whole: the same concatenation."""

    def get_image_features(self, *args, **kwargs):
        with _split_taken_whole(original):
            return original(self, *args, **kwargs)

    return get_image_features


@register_patch(
    "dynamo",
    *(f"transformers.models.{module}.modeling_{module}.{tower}.permute_input_for_window_attn" for module, tower in (
    ("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"), ("qwen2_5_omni", "Qwen2_5OmniVisionEncoder"),
    ("exaone4_5", "Exaone4_5_VisionModel"))),
    model_side="Qwen2_5_VisionTransformerPretrainedModel.permute_input_for_window_attn (and its "
               "Qwen2.5-Omni/EXAONE 4.5 copies) reshapes with the explicit hidden size or gathers `window_index "
               "* unit + arange(unit)` rows, so the merged-patch axis is not inferred by `-1` as the unbounded "
               "`s // (s // unit)`.",
)
def _patch_window_order_sized_by_the_index(_original):
    """Qwen2.5-VL-style towers put their merged patches in window order by reshaping to (patches // unit, unit,
    -1). With a symbolic patch count `s` the reshape's sizes come out as `s // (s // 4)`, which has no upper bound,
    and ExecuTorch plans such a tensor for its traced size only (an attention mask 32 long, asked for 48). The
    rows of each merged patch gathered in window order are the same rows, `len(window_index) * unit` of them."""

    def permute_input_for_window_attn(self, input_tensor, window_index, seq_len):
        unit = self.spatial_merge_unit
        rows = window_index[:, None] * unit + torch.arange(unit, device=window_index.device)
        return input_tensor[rows.flatten()]

    return permute_input_for_window_attn


@register_patch(
    "dynamo", "torch.nn.ModuleList.__getitem__", reports=True,
    model_side="Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration.forward keeps its per-step heads as"
               " one stacked weight indexed by generation_steps (a tensor index) instead of "
               "`self.lm_head[generation_steps]` on an nn.ModuleList with a shape-derived Python int.",
)
def _patch_linear_picked_by_a_symbolic_index(original):
    """A list of like linear layers indexed by a symbolic number (Qwen3-Omni's code predictor picks its head by the
    prompt's length) would need a Python index, which fixes the length. One layer whose weight is the stacked
    weights indexed by that number computes the same."""

    def __getitem__(self, index):
        if not isinstance(index, torch.SymInt):
            return original(self, index)
        layers = list(self)
        shapes = {(type(layer), layer.weight.shape, layer.bias is None) for layer in layers}
        if len(shapes) != 1 or next(iter(shapes))[0] is not torch.nn.Linear:
            return original(self, index)
        report_applied()
        weight = torch.stack([layer.weight for layer in layers])[index]
        bias = None if layers[0].bias is None else torch.stack([layer.bias for layer in layers])[index]
        return functools.partial(torch.nn.functional.linear, weight=weight, bias=bias)

    return __getitem__


@register_patch(
    "dynamo",
    "transformers.models.sew.modeling_sew.SEWEncoder.forward",
    "transformers.models.sew_d.modeling_sew_d.SEWDEncoder.forward",
    reports=True,
    model_side="SEWEncoder.forward and SEWDEncoder.forward pad the upsampled frames by max(n_input_timesteps - "
               "upsampled_length, 0) unconditionally instead of branching on `if hidden_states.shape[1] < "
               "n_input_timesteps`.",
)
def _patch_sew_upsampled_to_its_input_length(original):
    """SEW pools its frames by the squeeze factor and upsamples them back, then pads the one frame an odd count
    lost, *if* one was lost: a branch on the length's parity, which fixed the length. Padding the upsampled frames
    to the input's length, by zero frames or more, is the same tensor and no branch."""

    def forward(self, hidden_states, *args, **kwargs):
        length = hidden_states.shape[1]
        if not isinstance(length, torch.SymInt):
            return original(self, hidden_states, *args, **kwargs)
        report_applied()

        def to_input_length(_module, _inputs, upsampled):
            return torch.nn.functional.pad(upsampled, (0, 0, 0, length - upsampled.shape[1]))

        hook = self.upsample.register_forward_hook(to_input_length)
        try:
            return original(self, hidden_states, *args, **kwargs)
        finally:
            hook.remove()

    return forward


@register_patch(
    "dynamo", "transformers.models.csm.modeling_csm.CsmCodebooksHead.forward", reports=True,
    model_side="CsmCodebooksHead.forward computes all positions with one batched product (e.g. "
               "torch.einsum('bph,phv->bpv', hidden_states, codebook_weight)) instead of a Python loop over "
               "`range(codebook_weight.shape[0])`.",
)
def _patch_csm_codebook_heads_as_one_product(original):
    """CSM's depth decoder gives each position its own codebook head, one matrix product per position in a Python
    loop over the length, which fixed the length. One batched product over the positions is the same."""

    def forward(self, hidden_states, codebook_indices=None):
        if not isinstance(hidden_states.shape[1], torch.SymInt):
            return original(self, hidden_states, codebook_indices)
        report_applied()
        weights = self.weight[codebook_indices - 1]  # (positions, hidden, vocabulary); the first is the backbone's
        return torch.einsum("bph,phv->bpv", hidden_states, weights)

    return forward


@register_patch(
    "dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask",
    reports=True,
    model_side="CpmAntModel._prepare_attention_mask builds its left-padding distances with a descending "
               "torch.arange(seqlen - prompt_length - 1, -1, -1) instead of "
               "`torch.tensor(list(range(...))[::-1])`.",
)
def _patch_cpmant_padding_mask_by_arange(original):
    """CPM-Ant marks its left padding against the distance of each position from the end, built as a Python list
    of the text's length (`list(range(...))[::-1]`), which fixed the length. A descending `arange` is that list."""

    def _prepare_attention_mask(self, input_ids, span, context, length):
        batch, seqlen = input_ids.shape
        if isinstance(seqlen, torch.SymInt):  # a fixed length makes the same list
            report_applied()
        positions = torch.arange(seqlen, device=input_ids.device)
        causal = positions[None, :] <= positions[:, None]
        mask = context[:, None, :] | (context[:, :, None].logical_not() & causal[None])
        mask = mask & (span[:, None, :] == span[:, :, None])
        text_length = seqlen - self.prompt_length
        from_end = torch.arange(text_length - 1, -1, -1, device=input_ids.device)
        kept = torch.cat((torch.ones(batch, self.prompt_length, dtype=torch.bool, device=input_ids.device),
                          from_end[None, :] < length[:, None]), dim=1)  # the prompt, then the text past its padding
        return kept[:, :, None] & kept[:, None, :] & mask

    return _prepare_attention_mask


@register_patch(
    "dynamo", "transformers.models.prophetnet.modeling_prophetnet.ProphetNetPositionalEmbeddings.forward",
    reports=True,
    model_side="ProphetNetPositionalEmbeddings.forward multiplies its one-position tensor by "
               "`padding_idx + num_input_ids` as it is, without the `int()` cast (a SymInt in a trace).",
)
def _patch_prophetnet_decode_position_symbolic(original):
    """A ProphetNet decode step's position is `padding_idx + cached + new tokens`, cast with `int()` into a
    one-element tensor: the trace fixes the cache length at the traced step, and the decode program refuses every
    other step. The same product with the count left symbolic."""

    def forward(self, inputs_shape, device, attention_mask=None, past_key_values=None, position_ids=None):
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is not None or not isinstance(cached, torch.SymInt) or cached == 0:  # int() is exact there
            return original(self, inputs_shape, device, attention_mask, past_key_values, position_ids)
        report_applied()
        count = self.padding_idx + inputs_shape[1] + cached
        position_ids = torch.ones((1, 1), dtype=torch.long, device=device) * count
        return torch.nn.Embedding.forward(self, position_ids), position_ids

    return forward


@register_patch(
    "dynamo",
    "transformers.models.moonshine.modeling_moonshine.MoonshinePreTrainedModel._get_feat_extract_output_lengths",
    reports=True,
    model_side="MoonshinePreTrainedModel._get_feat_extract_output_lengths computes each convolution's output "
               "length with floor division `(length - kernel) // stride + 1` instead of `int((length - kernel) /"
               " stride + 1)`.",
)
def _patch_moonshine_conv_lengths_floor_divided(original):
    """Moonshine computes its convolutions' output length as `int((length - kernel) / stride + 1)`: a true division
    truncated by `int()`, which a symbolic length can only answer by fixing the length. For every length its
    convolutions accept that is the floor division."""

    def _get_feat_extract_output_lengths(self, input_lengths):
        if not isinstance(input_lengths, torch.SymInt):
            return original(self, input_lengths)
        report_applied()
        length = input_lengths
        for kernel, stride in ((127, 64), (7, 3), (3, 2)):
            length = _conv_output_length(length, kernel, stride)
        return length

    return _get_feat_extract_output_lengths


@register_patch(
    "dynamo", "transformers.models.neucodec.modeling_neucodec.NeuCodecModel.forward", reports=True,
    model_side="NeuCodecModel.forward cuts the decoded audio at `num_samples * output_sample_rate // "
               "input_sample_rate` (integer arithmetic) instead of `int(num_samples * factor)` with a float "
               "ratio.",
)
def _patch_neucodec_output_length_in_integers(original):
    """NeuCodec decodes at another sampling rate than it reads and cuts the audio at `int(samples * factor)`, the
    factor a float ratio of the two rates: `int()` of a symbolic length can only fix the length. The same cut is
    `samples * output_rate // input_rate`, which stays symbolic (and equal, where the float product is exact:
    checkpoints' 16 kHz to 24 kHz is 1.5)."""
    from transformers.models.neucodec.modeling_neucodec import NeuCodecOutput

    def forward(self, input_values, input_features, padding_mask=None, input_features_mask=None,
                output_latents=False, **kwargs):  # fmt: skip
        if not isinstance(input_values.shape[-1], torch.SymInt):
            return original(self, input_values, input_features, padding_mask, input_features_mask, output_latents,
                            **kwargs)  # fmt: skip
        report_applied()
        encoded = self.encode(input_values, input_features=input_features, padding_mask=padding_mask,
                              input_features_mask=input_features_mask, output_latents=True, return_dict=True)
        audio = self.decode(latents=encoded.latents, audio_codes_mask=encoded.audio_codes_mask, return_dict=True,
                            **kwargs).audio_values  # fmt: skip
        length = input_values.shape[-1] * self.config.output_sampling_rate // self.config.input_sampling_rate
        return NeuCodecOutput(
            audio_values=audio[..., :length], audio_codes=encoded.audio_codes,
            latents=encoded.latents if output_latents else None, audio_codes_mask=encoded.audio_codes_mask,
        )  # fmt: skip

    return forward


@register_patch(
    "dynamo", "transformers.models.xcodec.modeling_xcodec.conv1d_output_length", reports=True,
    model_side="transformers' conv1d_output_length (used by Xcodec) returns `numerator // stride + 1` instead of"
               " `int(numerator / stride + 1)`.",
)
def _patch_conv1d_output_length_floor_divided(original):
    """transformers' `conv1d_output_length` is the same `int(numerator / stride + 1)` as Moonshine's (Xcodec checks
    its acoustic and semantic frame counts agree by it): the floor division, for a numerator a convolution
    accepts."""

    def conv1d_output_length(module, input_length):
        if not isinstance(input_length, torch.SymInt):
            return original(module, input_length)
        report_applied()
        (padding,), (dilation,), (kernel,), (stride,) = module.padding, module.dilation, module.kernel_size, module.stride
        return _conv_output_length(input_length, kernel, stride, padding, dilation)

    return conv1d_output_length


def _conv_output_length(length, kernel, stride, padding=0, dilation=1):
    """A convolution's output length by floor division: for every length the convolution accepts, what
    `int(numerator / stride + 1)` answers, without the true division a symbolic length can only answer fixed."""
    return (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


@register_patch(
    "dynamo",
    "transformers.models.patchtst.modeling_patchtst.forecast_masking",
    "transformers.models.patchtsmixer.modeling_patchtsmixer.forecast_masking",
    reports=True,
    model_side="PatchTST's and PatchTSMixer's forecast_masking build the mask with tensor ops (a comparison of "
               "patch positions with a per-sample masked length, e.g. from torch.randperm/bucketize) instead of "
               "splitting the batch into groups by Python ints of the batch size.",
)
def _patch_forecast_masking_of_one_length(original):
    """PatchTST's and PatchTSMixer's forecast masking hides the last patches of each sample, samples split into
    groups by Python ints of the batch size, one group per masked length, then shuffled: that fixed the batch.
    With one length (their default) every sample hides the same last patches, the grouping and the shuffle change
    nothing, and the mask is one comparison with the positions."""

    def forecast_masking(inputs, num_forecast_mask_patches, unmasked_channel_indices=None, mask_value=0):
        lengths = num_forecast_mask_patches
        lengths = [lengths] if isinstance(lengths, int) else lengths
        if len(lengths) != 1:
            return original(inputs, num_forecast_mask_patches, unmasked_channel_indices, mask_value)
        if isinstance(inputs.shape[0], torch.SymInt):  # a fixed batch makes the same mask
            report_applied()
        batch_size, num_channels, sequence_length, num_features = inputs.shape
        if not 0 < lengths[0] < sequence_length:
            raise ValueError(f"num_forecast_mask_patches {lengths[0]} should be greater than 0 and less than total "
                             "patches.")
        last = torch.arange(sequence_length, device=inputs.device) >= sequence_length - lengths[0]
        mask = last.expand(batch_size, num_channels, sequence_length).float()
        if unmasked_channel_indices is not None:
            mask = mask.clone()
            mask[:, unmasked_channel_indices] = 0
        return inputs.masked_fill(mask.bool().unsqueeze(-1), mask_value), mask

    return forecast_masking


@register_patch(
    "dynamo", "transformers.models.musicflamingo.modeling_musicflamingo.MusicFlamingoModel"
    "._build_audio_timestamps", reports=True,
    model_side="MusicFlamingoModel._build_audio_timestamps counts the rows before each clip as `cumsum(rows) - "
               "rows` instead of prepending a zero to `cumsum(rows)[:-1]`.",
)
def _patch_music_flamingo_rows_before_by_subtraction(original):
    """Music Flamingo counts the encoder rows before each clip as a zero followed by all but the last running sum
    (`cumsum(...)[:-1]`): slicing one off a symbolic count makes torch ask whether the rest is shorter than two,
    which fixed the batch. The running sum minus each clip's own rows is the same count; the rest is as it was."""

    def _build_audio_timestamps(self, input_ids, post_lengths, max_post_length):
        if not isinstance(post_lengths.shape[0], torch.SymInt):
            return original(self, input_ids, post_lengths, max_post_length)
        report_applied()
        audio_tokens = input_ids == self.config.audio_token_id
        edges = torch.diff(torch.nn.functional.pad(audio_tokens.int(), (1, 1), value=0), dim=1)
        sample_lengths = (torch.where(edges == -1)[1] - torch.where(edges == 1)[1]).to(torch.long)
        torch._check_tensor_all(audio_tokens.sum() == post_lengths.sum(),
                                lambda: "Audio features and audio tokens do not match")
        frame_step = self.config.audio_frame_step * 4  # the encoder downsamples its frames 4 times
        frame_offsets = torch.arange(max_post_length, device=post_lengths.device, dtype=torch.float32) * frame_step
        rows_before = (torch.cumsum(post_lengths, dim=0) - post_lengths).float()
        sample_of_row = torch.searchsorted(torch.cumsum(sample_lengths, dim=0), rows_before, right=True)
        first_row = torch.searchsorted(sample_of_row, torch.arange(sample_lengths.shape[0], device=post_lengths.device))
        window = torch.arange(post_lengths.shape[0], device=post_lengths.device) - first_row[sample_of_row]
        return window.unsqueeze(1) * max_post_length * frame_step + frame_offsets

    return _build_audio_timestamps


@register_patch(
    "dynamo", "torch.nn.utils.rnn.pad_sequence", reports=True,
    upstream="https://github.com/pytorch/pytorch/issues/127153",
)
def _patch_pad_sequence_to_symbolic_longest(original):
    """Sequences whose lengths are read from data (Qwen-Omni's audio chunks, SeamlessM4T's vocoder units) are padded
    to the longest with `pad_sequence`, which the trace keeps as one op; the decompositions torch.onnx and
    ExecuTorch run then compare the lengths in Python (`max(...)`), which data-dependent lengths cannot answer. Each
    sequence padded up to the symbolic maximum of the lengths, then stacked, is the same tensor."""

    def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
        lengths = [sequence.shape[0] for sequence in sequences]
        if all(isinstance(length, int) for length in lengths):
            return original(sequences, batch_first, padding_value, padding_side)
        report_applied()
        longest = functools.reduce(torch.sym_max, lengths)
        padded = []
        for sequence, length in zip(sequences, lengths):
            before, after = (0, longest - length) if padding_side == "right" else (longest - length, 0)
            padding = [0, 0] * (sequence.dim() - 1) + [before, after]  # the last pair pads the first axis
            padded.append(torch.nn.functional.pad(sequence, padding, value=padding_value))
        return torch.stack(padded, dim=0 if batch_first else 1)

    return pad_sequence
