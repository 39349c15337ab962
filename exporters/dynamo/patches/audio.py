"""Stage 2 model patches: speech and audio models: EnCodec's and Mimi's convolution paddings, FastSpeech 2's length
regulator and relative positions, SeamlessM4T's vocoder units. Their neighbours in registration order sit here too:
the distribution check, ESMFold's identity frames, OmDet-Turbo's prompts.
"""

from __future__ import annotations

import torch

from ...registration import register_patch, report_applied
from .grids import part_starts


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo",
    "transformers.models.encodec.modeling_encodec.EncodecConv1d.forward",
    "transformers.models.mimi.modeling_mimi.MimiConv1d.forward",
    "transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer"
    ".PocketTTSAudioTokenizerConv1d.forward",
    model_side="EncodecConv1d / MimiConv1d / PocketTTSAudioTokenizerConv1d keep kernel_size, stride and "
               "padding_total as Python ints (not 0-d tensor buffers) and compute the extra right padding with "
               "integer ceiling division, so no padding amount is read from a tensor.",
)
def _patch_codec_conv_paddings_as_ints(original):
    """EnCodec's and Mimi's padded convolutions keep kernel size, stride and padding as 0-d tensor buffers and pad
    by amounts computed from them: under export each amount is a value read from a tensor, unknown to the trace,
    and the padding guards on it (`Eq(u0, 1)`). They are the convolution's own sizes: for the call they are ints,
    and the extra right padding an integer ceiling division."""

    def forward(self, hidden_states, *args, **kwargs):
        kernel = (self.conv.kernel_size[0] - 1) * self.conv.dilation[0] + 1
        stride = self.conv.stride[0]
        total = kernel - stride

        def extra_padding(hidden_states):  # up to the length a whole number of strides covers
            length = hidden_states.shape[-1]
            frames = (length - kernel + total + stride - 1) // stride  # non-negative: ONNX divides by truncating
            return frames * stride + kernel - total - length

        sizes = {"kernel_size": kernel, "stride": stride, "padding_total": total, "padding_right": total // 2,
                 "padding_left": total - total // 2, "_get_extra_padding_for_conv1d": extra_padding}
        previous = {name: self.__dict__[name] for name in sizes if name in self.__dict__}
        self.__dict__.update(sizes)  # instance attributes come before the module's buffers
        try:
            return original(self, hidden_states, *args, **kwargs)
        finally:
            for name in sizes:
                self.__dict__.pop(name, None)
            self.__dict__.update(previous)

    return forward


@register_patch(
    "dynamo", "torch.distributions.categorical.Categorical.__init__",
    upstream="https://github.com/pytorch/pytorch/pull/186291",
)
def _patch_categorical_unvalidated(original):
    """A distribution validates its parameters with `if not constraint.check(value).all()`, a branch on tensor
    values export cannot take (BLT's patcher: the entropy of its logits). The values are the model's own."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        original(self, probs, logits, validate_args=False)

    return __init__


_RIGID = "transformers.models.esm.openfold_utils.rigid_utils"


@register_patch(
    "dynamo", f"{_RIGID}.identity_rot_mats", f"{_RIGID}.identity_trans", f"{_RIGID}.identity_quats",
    model_side="transformers' esm openfold_utils rigid_utils.identity_rot_mats / identity_trans / identity_quats"
               " stop being @functools.cache'd on their shape/dtype/device arguments (build the identity tensors"
               " afresh each call), so symbolic shapes are never cache keys and no traced tensor is reused "
               "across traces.",
)
def _patch_identity_frames_uncached(original):
    """ESMFold's structure module starts from identity frames made by functions cached on their shape: a symbolic
    shape cannot be a cache key, and a tensor cached by one trace would come back in the next. Made afresh."""
    return original.__wrapped__


_OMDET = "transformers.models.omdet_turbo.modeling_omdet_turbo"


@register_patch(
    "dynamo", f"{_OMDET}.OmDetTurboForObjectDetection.get_language_embedding", reports=True,
    model_side="OmDetTurboForObjectDetection.get_language_embedding encodes all class/task prompts in one batch "
               "without the token-id-keyed Python cache and pads each sample's classes with a gather from their "
               "start offsets instead of a per-sample Python loop.",
)
def _patch_omdet_prompts_encoded_at_once(original):
    """OmDet-Turbo encodes its class and task prompts one by one, to look each up in a cache keyed by its token ids
    read as Python numbers (a key export cannot read; a hit would bake eager's features into the program), then
    pads each sample's classes to the most any sample has, sample by sample: the prompt and sample counts were
    fixed. Every prompt encoded at once, nothing cached, and each sample's classes gathered from where they start
    (zeros past its count): the same features."""

    def get_language_embedding(self, classes_input_ids, classes_attention_mask, tasks_input_ids, tasks_attention_mask,
                               classes_structure):
        report_applied()
        classes = self.language_backbone(classes_input_ids, encode_type="class")
        tasks, task_mask = self.language_backbone(tasks_input_ids, mask=tasks_attention_mask, encode_type="task")
        most = classes_structure.max().item()
        torch._check(most >= 0)  # bounds ExecuTorch plans the features for
        torch._check(most <= classes.shape[0])
        slots = torch.arange(most, device=classes.device)[:, None]  # (slot, sample)
        inside = slots < classes_structure[None]
        rows = (part_starts(classes_structure)[None] + slots).clamp(max=classes.shape[0] - 1)
        class_embeddings = torch.where(inside[..., None], classes[rows], 0.0)
        return class_embeddings.to(self.device), tasks.to(self.device), task_mask.to(self.device)

    return get_language_embedding


@register_patch(
    "dynamo", f"{_OMDET}.OmDetTurboLanguageBackbone.forward", reports=True,
    upstream="https://github.com/pytorch/pytorch/pull/185545",
)
def _patch_omdet_task_prompts_cut_within_the_mask(original):
    """OmDet-Turbo cuts its task prompts to the longest one, a length read from the mask with `.item()` and known
    to torch only as some integer: `to_edge`'s slice decomposition then asks whether it is negative or past the
    width ("Could not guard on data-dependent expression u28 < 0", "u14 > s63"). The same tokens picked by
    their positions, the length known to lie between zero and the mask's width."""

    def forward(self, hidden_states, mask=None, encode_type="task"):
        if encode_type != "task" or mask is None:
            return original(self, hidden_states, mask, encode_type)
        report_applied()
        encoded = self.model(hidden_states)[0]
        longest = (mask != 0).sum(1).max().item()
        torch._check(longest >= 0)
        torch._check(longest <= mask.shape[1])
        # picked rather than sliced: a slice compares its end with the width, which a number read from data and a
        # symbolic width leave undecided
        kept = torch.arange(longest, device=mask.device)
        return encoded.index_select(1, kept).transpose(0, 1), mask.index_select(1, kept)

    return forward


@register_patch(
    "dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.length_regulator",
    model_side="transformers' fastspeech2_conformer length_regulator expands phonemes for all rows at once (a "
               "cumulative-duration gather or repeat_interleave padded to the longest row) instead of a Python "
               "loop over the batch behind an `if durations.sum() == 0` branch.",
)
def _patch_length_regulator_gathered(original):
    """FastSpeech 2 repeats each phoneme's features for its predicted duration in a loop over the batch, after an
    `if durations.sum() == 0` branch on tensor values. The same frames gathered at once: frame f of a row takes the
    phoneme whose cumulative duration first exceeds f, and frames past the row's total stay zero."""

    def length_regulator(encoded_embeddings, duration_labels, speaking_speed=1.0):
        if speaking_speed <= 0:
            raise ValueError("`speaking_speed` must be greater than 0.")
        if speaking_speed != 1.0:
            duration_labels = torch.round(duration_labels.float() * speaking_speed).long()
        silent_rows = duration_labels.sum(dim=1, keepdim=True).eq(0) & duration_labels.sum().eq(0)
        duration_labels = torch.where(silent_rows, torch.ones_like(duration_labels), duration_labels)
        return _repeated_by_durations(encoded_embeddings, duration_labels).float()

    return length_regulator


def _repeated_by_durations(features: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
    """Each row's features `(batch, steps, channels)` repeated for their durations `(batch, steps)`, the rows padded
    with zeros to the longest, gathered at once: frame f of a row takes the step whose cumulative duration first
    exceeds f."""
    ends = durations.cumsum(dim=1)
    longest = ends[:, -1].max().item()
    torch._check(longest > 1, lambda: "the longest row is a single frame")  # broadcasts stay unambiguous
    frames = torch.arange(longest, device=ends.device)
    step = (frames[None, :, None] >= ends[:, None, :]).sum(dim=-1)
    step = step.clamp(max=features.size(1) - 1)[..., None].expand(-1, -1, features.size(2))
    inside = (frames[None, :] < ends[:, -1:])[..., None]
    return torch.where(inside, torch.gather(features, 1, step), 0)


@register_patch(
    "dynamo", "transformers.models.seamless_m4t.modeling_seamless_m4t.SeamlessM4TCodeHifiGan.forward",
    model_side="SeamlessM4TCodeHifiGan.forward repeats every sample's units by its durations in one batched op "
               "(repeat_interleave/gather, padded) instead of a Python loop over the batch.",
)
def _patch_seamless_m4t_units_repeated_at_once(original):
    """SeamlessM4T's vocoder repeats each sample's units for their predicted durations sample by sample, in a
    Python loop over the batch (one sample takes another branch): the batch was fixed. Every sample's units
    repeated at once (`_repeated_by_durations`), padded as eager pads them; the rest is eager's."""

    def forward(self, input_ids, spkr_id, lang_id, **kwargs):
        units = self.unit_embedding(input_ids)
        durations = torch.clamp(torch.round(torch.expm1(self.dur_predictor(units))).long(), min=1)
        hidden_states = _repeated_by_durations(units, durations).transpose(1, 2)
        frames = hidden_states.shape[-1]
        speaker = self.speaker_embedding(spkr_id).transpose(1, 2).repeat(1, 1, frames)
        language = self.language_embedding(lang_id).transpose(1, 2).repeat(1, 1, frames)
        hidden_states = self.hifi_gan(torch.cat([language, hidden_states, speaker], dim=1))
        lengths = self._get_output_hifigan_lengths(self._get_dur_output_lengths(input_ids, durations))
        return hidden_states, lengths

    return forward


@register_patch(
    "dynamo",
    "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.FastSpeech2ConformerRelPositionalEncoding"
    ".extend_pos_enc",
    model_side="FastSpeech2ConformerRelPositionalEncoding.extend_pos_enc either precomputes a table for the "
               "maximum length or computes positions on the fly, instead of a Python branch that rebuilds the "
               "table when the (data-dependent) frame count outgrows it.",
)
def _patch_relative_positions_within_table(original):
    """FastSpeech 2's decoder rebuilds its relative position table when the frames outgrow it, a branch on the
    frame count, which its length regulator makes a value read from the durations. The program keeps the table it
    has (5,000 frames) and asserts the frames fit."""

    def extend_pos_enc(self, x, pos_enc=None):
        if pos_enc is None:
            return original(self, x, pos_enc)
        torch._check(pos_enc.size(1) >= x.size(1) * 2 - 1,
                     lambda: f"{x.size(1)} frames outgrow the relative position table of {pos_enc.size(1)}")
        return pos_enc.to(dtype=x.dtype, device=x.device)

    return extend_pos_enc
