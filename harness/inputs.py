"""Inputs for every model class, from its forward signature, ``main_input_name`` and config.

Each forward argument is filled by the rule named for it in ``_RULES`` when the argument is required or is one
a real caller passes (masks, token types, images next to text). Seeded and deterministic; batch >= 2 so that
dynamic shapes do not specialise the batch to 1. Vision-language models get their image placeholder tokens: as
many as the vision tower emits, counted by running it once.
"""

from __future__ import annotations

import inspect
import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, get_args

import torch

from .tables import (
    AUDIO_FRAME_MULTIPLES,
    AUDIO_FRAMES_PER_TOKEN,
    FEATURE_EXTRACTOR_OVERRIDES,
    MAIN_INPUTS,
    ONE_SAMPLE_BATCH,
    PIXEL_LAYOUTS,
    RAW_AUDIO_CHANNELS,
)
from .tiny import IMAGE, PATCH, SPECIAL_FLOOR, special_token_ids, text_vocab

# The two input sets: "A" is exported with, "B" (another batch and length) runs dynamic exports.
INPUT_SIZES = {"A": (2, 7), "B": (3, 5)}
# an encoder-decoder's decoder text: as long as its encoder's in A, one shorter in B, so that a program traced on A
# whose decoder length was tied to its encoder's refuses B
DECODER_LENGTHS = {"A": INPUT_SIZES["A"][1], "B": INPUT_SIZES["B"][1] - 1}
AUDIO_SAMPLES = {"A": 8000, "B": 6400}  # raw audio: ~25 frames after a wav2vec2-style feature extractor
# A backbone's last map is 1/16 to 1/32 of its image; 1/16 keeps both axes of a tiny image's map above 1.
BACKBONE_MAP_STRIDE = 16
NUM_CHOICES = 2
MODALITY_INPUTS = {
    "pixel_values": "image",
    "pixel_values_videos": "video",
    "input_features": "audio",
    "input_values": "audio",
    "flattened_patches": "image",
    "high_res_pixel_values": "image",
    "past_values": "time-series",
    "inputs": "audio",
    "audio_mel": "audio",
    "moshi_audio_codes": "audio",
    "user_audio_codes": "audio",
}


class InputError(ValueError):
    """The factory cannot feed this class."""


@dataclass
class Context:
    model: torch.nn.Module
    config: Any
    batch: int
    length: int
    label: str
    generator: torch.Generator
    parameters: dict[str, inspect.Parameter]
    special: set[int] = field(default_factory=set)
    inputs_so_far: dict[str, Any] = field(default_factory=dict)
    label_hint: str = ""  # "video" for video classes; "image" for images fed as hidden_states
    frame_axis: int = -1  # the axis of the audio features that counts frames (the other counts mel bins)

    def sub(self, *names):
        """The first sub-config of ``names`` the config has (or the VLM a retriever wraps), else the config itself."""
        for config in (self.config, getattr(self.config, "vlm_config", None)):
            for name in names:
                value = getattr(config, name, None)
                if value is not None and not isinstance(value, (int, str, dict)):
                    return value
        return self.config

    def get(self, key, default=None, *sub_names):
        config = self.sub(*sub_names) if sub_names else self.config
        value = getattr(config, key, None)
        return default if value is None else value

    def tokens(self, length: int | None = None, batch: int | None = None) -> torch.Tensor:
        vocab = text_vocab(self.config)
        high = min(vocab, SPECIAL_FLOOR) if vocab > 8 else vocab
        low = 4 if high > 12 else 0
        ids = torch.randint(low, high, (batch or self.batch, length or self.length), generator=self.generator)
        for special in self.special:  # never an accidental placeholder or pad token
            ids[ids == special] = low + (special % max(1, high - low - 1)) + 1 if low + 1 < high else low
        return ids

    def randn(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.generator)


def _configured_away(config, tower: str) -> bool:
    """A multimodal class whose default config leaves a tower out (Gemma 4 without audio): feed it nothing."""
    return tower in vars(config) and vars(config)[tower] is None


def _image_shape(context: Context) -> tuple[int, int, int]:
    vision = context.sub("vision_config", "backbone_config", "encoder_config", "encoder")
    size = getattr(vision, "image_size", None) or getattr(context.config, "image_size", None) or IMAGE
    height, width = (size, size) if isinstance(size, int) else (size[0], size[-1])
    channels = getattr(vision, "num_channels", None) or getattr(context.config, "num_channels", None) or 3
    return channels, height, width


def _pixel_values(context: Context) -> torch.Tensor:
    """Images in the layout the model reads: (batch, C, H, W) mostly; a list of images per sample (batch, 1, C, H,
    W) for models with an image mask; flattened patches (batch, patches, C*P*P) for patch-native encoders."""
    if _configured_away(context.config, "vision_config"):
        return None
    name = type(context.model).__name__
    layout = PIXEL_LAYOUTS.get(context.config.model_type)
    if layout == "patches" or "spatial_shapes" in context.parameters:
        return _patch_pixels(context)
    if layout == "flat-patches":
        return _patch_pixels(context).flatten(0, 1)
    if layout == "packed":
        rows, columns = _target_sizes(context)[0].tolist()
        patch = getattr(context.sub("vision_config"), "patch_size", PATCH)
        return context.randn(1, _image_shape(context)[0], patch, context.batch * rows * columns * patch)
    if layout == "image-tiles":
        return _image_tiles(context)
    if layout == "patch-clips":  # four patches a sample
        vision = context.sub("vision_config")
        patch = getattr(vision, "patch_size", PATCH)
        frames = getattr(vision, "temporal_patch_size", 1)
        return context.randn(context.batch * 4, frames, patch, patch, _image_shape(context)[0])
    if layout == "tiles":  # the base image plus one tile, with the image size the tiles were cut from
        context.inputs_so_far["image_sizes"] = _image_sizes(context)
        return context.randn(context.batch, 2, *_image_shape(context))
    masks = {"pixel_attention_mask", "image_attention_mask"} & set(context.parameters)
    if _per_patch_image_mask(context):  # FLAVA: a mask over one image's patches, not a list of images
        masks.discard("image_attention_mask")
    if layout in ("images", "flagged-images") or masks:
        pixels = context.randn(context.batch, 1, *_image_shape(context))
        if "pixel_attention_mask" in context.parameters:  # which pixels are real, or which images
            per_image = layout == "flagged-images"
            mask_shape = (context.batch, 1) if per_image else (context.batch, 1, *pixels.shape[-2:])
            context.inputs_so_far["pixel_attention_mask"] = torch.ones(mask_shape, dtype=torch.bool)
        return pixels
    frames = getattr(context.sub("vision_config"), "num_frames", None) or getattr(context.config, "num_frames", None)
    if layout == "half-canvas":
        channels, height, width = _image_shape(context)
        return context.randn(context.batch, channels, height // 2, width)
    if layout == "pairs" or "KeypointMatching" in name:  # an image pair
        return context.randn(context.batch, 2, *_image_shape(context))
    # a video class whose only visual input is pixel_values (not its image tower alone, not image-or-video models)
    video_class = any(word in name for word in ("Video", "Vivit", "Timesformer")) and "Vision" not in name and not (
        {"pixel_values_images", "pixel_values_videos"} & set(context.parameters))
    if layout == "flat-video":
        context.label_hint = "video"
        return context.randn(context.batch * frames, *_image_shape(context))
    if (frames and _int_attr(context.config, "tubelet_size")) or video_class or layout == "video":  # a clip
        context.label_hint = "video"
        return context.randn(context.batch, frames or 4, *_image_shape(context))
    return context.randn(context.batch, *_image_shape(context))


def _image_tiles(context: Context) -> torch.Tensor:
    """Mllama: one image per sample in max_num_tiles tiles, of which the first is used (aspect ratio id 1, 1:1);
    text tokens cross-attend to it."""
    tiles = context.get("max_num_tiles", 4, "vision_config")
    used = torch.zeros(context.batch, 1, tiles, dtype=torch.long)
    used[..., 0] = 1
    context.inputs_so_far["aspect_ratio_ids"] = torch.ones(context.batch, 1, dtype=torch.long)
    context.inputs_so_far["aspect_ratio_mask"] = used
    if "cross_attention_mask" in context.parameters:
        context.inputs_so_far["cross_attention_mask"] = used[:, None].expand(-1, context.length, -1, -1).contiguous()
    return context.randn(context.batch, 1, tiles, *_image_shape(context))


def _patch_grid(context: Context) -> tuple[int, int]:
    """The image's patches: (rows, columns)."""
    patch = getattr(context.sub("vision_config"), "patch_size", PATCH)
    _channels, height, width = _image_shape(context)
    return max(1, height // patch), max(1, width // patch)


def _patch_pixels(context: Context) -> torch.Tensor:
    patch = getattr(context.sub("vision_config"), "patch_size", PATCH)
    channels = _image_shape(context)[0]
    rows, columns = _patch_grid(context)
    if "spatial_shapes" in context.parameters:
        context.inputs_so_far["spatial_shapes"] = torch.tensor([[rows, columns]] * context.batch)
        context.inputs_so_far["pixel_attention_mask"] = torch.ones(context.batch, rows * columns, dtype=torch.long)
    # Gemma 4's tower: each patch's (column, row), by either name (Diffusion Gemma's encoder hands them down)
    for name in {"pixel_position_ids", "image_position_ids"} & set(context.parameters):
        row, column = torch.meshgrid(torch.arange(rows), torch.arange(columns), indexing="ij")
        positions = torch.stack([column, row], dim=-1).reshape(1, rows * columns, 2)
        context.inputs_so_far[name] = positions.repeat(context.batch, 1, 1)
    return context.randn(context.batch, rows * columns, channels * patch * patch)


def _pooled_patches(context: Context) -> torch.Tensor:
    """Molmo 2: the patches each image token pools, 2 x 2 blocks of its image's patch grid, as indices into the
    patches of all images."""
    rows, columns = _patch_grid(context)
    grid = torch.arange(rows * columns).view(rows // 2, 2, columns // 2, 2).permute(0, 2, 1, 3).reshape(-1, 4)
    return torch.cat([grid + image * rows * columns for image in range(context.batch)])


def _flattened_patches(context: Context) -> torch.Tensor:
    """Pix2Struct and Kosmos-2.5: each patch row starts with its 1-based grid row and column (0 marks padding)."""
    vision = context.sub("vision_config")
    width = getattr(vision, "patch_embed_hidden_size", None) or getattr(context.config, "patch_embed_hidden_size")
    side = IMAGE // PATCH
    rows, columns = torch.meshgrid(torch.arange(1, side + 1), torch.arange(1, side + 1), indexing="ij")
    grid = torch.stack([rows.flatten(), columns.flatten()], -1).float().expand(context.batch, -1, -1)
    return torch.cat([grid, context.randn(context.batch, side * side, width)], -1)


def _image_embeds_position_mask(context: Context) -> torch.Tensor | None:
    """Kosmos-2: which text positions the image's latent queries take, right after the first token."""
    queries = getattr(context.config, "latent_query_num", None)
    if not queries or queries + 1 > context.length:
        return None
    mask = torch.zeros(context.batch, context.length, dtype=torch.long)
    mask[:, 1 : 1 + queries] = 1
    return mask


def _int_attr(config, name):
    value = getattr(config, name, None)
    return value if isinstance(value, (int, list, tuple)) and not isinstance(value, bool) else None


def _input_features(context: Context) -> torch.Tensor:
    """Audio features made by the model type's own feature extractor from random audio, so their layout (mel bins
    first or frames first), bin count and framing are the model's; encoders with a fixed frame count (Whisper's
    2 x max_source_positions) get exactly that many frames."""
    if _configured_away(context.config, "audio_config"):
        return None
    config = context.sub("audio_config", "encoder_config", "encoder")
    config = getattr(config, "asr_config", None) or config  # Nemotron 3.5 Transcribe: the speech encoder's config
    bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", None)
    chroma = getattr(context.config, "num_chroma", None)
    if chroma:  # MusicGen Melody conditions on a chromagram, (batch, frames, pitch classes); torchaudio makes it
        context.frame_axis = 1
        return context.randn(context.batch, 64, chroma)
    per_token = AUDIO_FRAMES_PER_TOKEN.get(context.config.model_type)
    if per_token:
        return context.randn(context.batch, bins or 80, per_token * context.length)
    features = _audio_features(context, config, bins)
    if features is not None and features.dim() == 3:
        multiple = AUDIO_FRAME_MULTIPLES.get(context.config.model_type, 1)
        frames = features.shape[context.frame_axis] // multiple * multiple
        if frames != features.shape[context.frame_axis]:  # a copy: a view would bring its base's size to the trace
            features = features.narrow(context.frame_axis, 0, frames).clone()
    return features


def _audio_features(context: Context, config, bins: int | None) -> torch.Tensor:
    extractor = _feature_extractor(context.config.model_type, bins)
    # Whisper-style extractors pad to a fixed chunk; their encoders take exactly 2 x max_source_positions frames.
    positions = getattr(config, "max_source_positions", None) if hasattr(extractor, "chunk_length") else None
    if extractor is not None:
        hop = getattr(extractor, "hop_length", 160)
        length = 2 * positions * hop if positions else AUDIO_SAMPLES[context.label]
        audio = [(torch.randn(length, generator=context.generator) * 0.1).numpy() for _ in range(context.batch)]
        options = {"sampling_rate": getattr(extractor, "sampling_rate", 16000), "return_tensors": "pt"}
        try:
            features = extractor(audio, padding="max_length" if positions else "longest", max_length=length, **options)
        except TypeError:
            features = extractor(audio, **options)
        values = features.get("input_features")
        if values is not None:
            bins = bins or getattr(extractor, "feature_size", None)
            if values.dim() == 3 and values.shape[2] == bins:
                context.frame_axis = 1  # frames first
            elif positions and values.shape[-1] > 2 * positions:  # padded to its own 30 s chunk regardless (MOSS)
                values = values[..., : 2 * positions].clone()
            elif values.dim() == 4 and getattr(config, "enable_fusion", None) is False:
                values = values[:, :1].clone()  # CLAP: a short clip's fused views are four copies of its one mel
            # some extractors hand back a view of their padded buffer, whose strides a trace would take for the input's
            return values.float().contiguous()
    reader = _first_layer(context.model)
    if isinstance(reader, torch.nn.Linear):  # stacked frames into a linear layer (Granite Speech): frames first
        context.frame_axis = 1
        stacked = getattr(config, "subsampling_factor", None)  # stacked by the model itself (Nemotron 3 audio)
        width = bins if bins and stacked and reader.in_features == stacked * bins else reader.in_features
        # a codec that reads the samples beside their features (X-Codec 2, whose extractor needs torchaudio): a
        # frame per hop of the samples, as its two encoders' frames must meet
        hop = getattr(context.config, "hop_length", None) if "input_values" in context.parameters else None
        return context.randn(context.batch, AUDIO_SAMPLES[context.label] // hop if hop else 64, width)
    positions = getattr(config, "max_source_positions", None)
    return context.randn(context.batch, bins or 80, 2 * positions if positions else 64)


def _first_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first linear or convolution layer a model registers: what its input's last width must match."""
    layers = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)
    return next((module for module in model.modules() if isinstance(module, layers)), None)


def _feature_extractor(model_type: str, bins: int | None):
    """The model type's feature extractor, set to the config's number of mel bins."""
    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    name = FEATURE_EXTRACTOR_OVERRIDES.get(model_type) or FEATURE_EXTRACTOR_MAPPING_NAMES.get(model_type)
    if not name:
        return None
    extractor_class = getattr(transformers, name)
    for options in ({"feature_size": bins} if bins else None, {}):
        if options is None:
            continue
        try:
            return extractor_class(**options)
        except Exception:  # a keyword it does not take, or an optional package it needs
            continue
    return None


def _without_prenet(context: Context, half: str) -> bool:
    """SpeechT5's bare model: its encoder or decoder reads states of its width, no prenet turns sound into them."""
    return type(getattr(context.model, half, None)).__name__.endswith("WithoutPrenet")


def _input_values(context: Context) -> torch.Tensor:
    config = context.config
    if getattr(config, "num_mel_bins", None) and getattr(config, "max_length", None):  # a spectrogram (AST)
        return context.randn(context.batch, config.max_length, config.num_mel_bins)
    if _without_prenet(context, "encoder"):
        context.label_hint = "audio"
        return context.randn(context.batch, context.length, context.get("hidden_size", 32))
    return _raw_audio(context)


def _decoder_input_values(context: Context) -> torch.Tensor:
    width = context.get("hidden_size", 32) if _without_prenet(context, "decoder") else context.get("num_mel_bins", 80)
    return context.randn(context.batch, 4, width)


def _noise(context: Context) -> torch.Tensor:
    """Models that mask at random (ViTMAE) take their noise as an input, so eager and export draw the same."""
    if context.get("max_action_dim"):  # a flow-matching policy's noisy action chunk
        return context.randn(context.batch, context.get("chunk_size", 4), context.config.max_action_dim)
    vision = context.sub("vision_config")
    _channels, height, width = _image_shape(context)
    units = getattr(vision, "masked_unit_size", None)
    if units:  # Hiera masks units of tokens, not patches
        (stride_y, stride_x), (unit_y, unit_x) = vision.patch_stride, units
        return torch.rand(context.batch, (height // stride_y // unit_y) * (width // stride_x // unit_x),
                          generator=context.generator)
    patch = getattr(vision, "patch_size", 16)
    patch = patch if isinstance(patch, int) else patch[0]
    return torch.rand(context.batch, (height // patch) * (width // patch), generator=context.generator)


def _input_ids(context: Context) -> torch.Tensor:
    if "input_ids" in context.inputs_so_far:  # filled with the inputs they go with (ESMFold 2's proteins)
        return context.inputs_so_far["input_ids"]
    codes = getattr(context.config, "n_codes_total", None)
    if isinstance(codes, int) and "codebook_idx" in context.parameters:  # Bark's fine model: every codebook at once
        return torch.stack([context.tokens() for _ in range(codes)], dim=-1)
    codebooks = getattr(context.config, "num_codebooks", None)
    codes = getattr(context.config, "codebook_vocab_size", None)
    if isinstance(codes, int) and isinstance(codebooks, int):
        # Kyutai speech-to-text: a text stream and one audio-code stream per codebook, (batch, length, 1 + codebooks)
        audio = torch.randint(0, min(codes, SPECIAL_FLOOR), (context.batch, context.length, codebooks),
                              generator=context.generator)
        return torch.cat([context.tokens()[..., None], audio], dim=-1)
    if isinstance(codebooks, int) and hasattr(context.config, "codebook_pad_token_id"):
        # CSM's backbone: a frame of every codebook per position, (batch, length, codebooks)
        return torch.stack([context.tokens() for _ in range(codebooks)], dim=-1)
    residues = getattr(context.model, "af2_to_esm", None)  # ESMFold reads residue types, which it maps to ESM's ids
    if isinstance(residues, torch.Tensor):
        return torch.randint(0, residues.numel() - 2, (context.batch, context.length), generator=context.generator)
    own_codes = {"decoder_input_ids", "moshi_audio_codes"} & set(context.parameters)  # codes come by another name
    if isinstance(codebooks, int) and codebooks > 1 and not own_codes:
        # audio-code decoders (MusicGen) take one row per codebook: (batch * codebooks, length)
        return context.tokens(batch=context.batch * codebooks)
    return context.tokens()


def _attention_mask(context: Context) -> torch.Tensor | None:
    """All ones, shaped like the input it masks: token ids or raw audio; other inputs get none."""
    inputs = context.inputs_so_far
    if "input_ids" in inputs:
        return torch.ones(inputs["input_ids"].shape[:2], dtype=torch.long)
    audio = inputs.get("input_values")
    if audio is not None and audio.dim() == 2:
        return torch.ones(audio.shape, dtype=torch.long)
    return None


def _decoder_input_ids(context: Context) -> torch.Tensor | None:
    """For encoder-decoder models only: a decoder-only language model has no decoder inputs."""
    configs = [context.config, getattr(context.config, "text_config", None)]
    if any(getattr(config, "is_encoder_decoder", False) for config in configs if config is not None):
        codebooks = _decoder_codebooks(context.config)
        channels = getattr(getattr(context.config, "decoder_config", None), "num_channels", None)
        # a sequence classifier reads its decoder's states at its encoder's end-of-sequence tokens: equal lengths
        classifier = type(context.model).__name__.endswith("ForSequenceClassification")
        length = context.length if classifier else DECODER_LENGTHS[context.label]
        if isinstance(channels, int) and channels > 1:  # Dia's decoder: a code per audio channel, channels last
            return torch.stack([context.tokens(length) for _ in range(channels)], dim=-1)
        return context.tokens(length, batch=context.batch * codebooks) if codebooks else context.tokens(length)
    if context.parameters["decoder_input_ids"].default is inspect.Parameter.empty:
        return context.tokens()
    if getattr(context.config, "canvas_length", None):  # block diffusion: else a canvas drawn at random
        return context.tokens()
    if type(context.model).__name__.endswith("ForQuestionAnswering"):  # BLIP: an answer decoder on its encoders
        return context.tokens()
    return None


def _audio_codes(context: Context) -> torch.Tensor | None:
    """Inkling's audio tower alone: a code of every codebook per frame, (batch, frames, codebooks). Its composite
    places audio by placeholder tokens, which the text here does not hold."""
    codebooks, size = context.get("num_codebooks"), context.get("codebook_size")
    if "input_ids" in context.parameters or not (isinstance(codebooks, int) and isinstance(size, int)):
        return None
    context.label_hint = "audio"
    return torch.randint(0, size, (context.batch, context.length, codebooks), generator=context.generator)


def _moshi_codes(context: Context) -> torch.Tensor:
    """Moshi's two audio streams (its own and the user's) beside its text: a code of every codebook per position,
    (batch, codebooks, length)."""
    codes = torch.stack([context.tokens() for _ in range(context.get("num_codebooks"))], dim=1)
    return codes % context.get("audio_vocab_size")


def _decoder_codebooks(config) -> int | None:
    """MusicGen's decoder reads audio codes, one row per codebook: (batch * codebooks, length)."""
    codebooks = getattr(getattr(config, "decoder", None), "num_codebooks", None)
    return codebooks if isinstance(codebooks, int) and codebooks > 1 else None


def _token_type_ids(context: Context) -> torch.Tensor:
    ids = context.inputs_so_far.get("input_ids")
    shape = ids.shape if ids is not None else (context.batch, context.length)
    kinds = getattr(context.config, "type_vocab_sizes", None)
    if isinstance(kinds, (list, tuple)):  # table models (TAPAS): one type id per kind of position
        return torch.zeros(*shape, len(kinds), dtype=torch.long)
    return torch.zeros(shape, dtype=torch.long)


def _bbox(context: Context) -> torch.Tensor:
    corners = torch.randint(0, 500, (context.batch, context.length, 2), generator=context.generator)
    sizes = torch.randint(1, 500, (context.batch, context.length, 2), generator=context.generator)
    return torch.cat([corners, corners + sizes], dim=-1)


def _past_values(context: Context) -> torch.Tensor:
    config = context.config
    length = getattr(config, "context_length", None) or getattr(config, "prediction_length", None) or 32
    lags = getattr(config, "lags_sequence", None)
    length += max(lags) if lags else 0
    channels = getattr(config, "num_input_channels", None) or getattr(config, "input_size", None)
    if channels in (None, 1) and getattr(config, "num_input_channels", None) is None:  # univariate: (batch, time)
        return context.randn(context.batch, length)
    return context.randn(context.batch, length, channels)


def _image_sizes(context: Context) -> torch.Tensor:
    _channels, height, width = _image_shape(context)
    return torch.tensor([[height, width]] * context.batch)


def _grid_thw(context: Context) -> torch.Tensor:
    """A vision tower of a Qwen-style model called on its own: the patch grid of the flattened patches."""
    if "image_grid_thw" in context.inputs_so_far:
        return context.inputs_so_far["image_grid_thw"]
    grid = _grid_pixel_values(context)
    context.inputs_so_far["pixel_values"] = grid["pixel_values"]
    return grid["image_grid_thw"]


def _merge_sizes(context: Context) -> torch.Tensor:
    """VideoLLaMA3: each image's spatial merge factor, one per image of the grid (one image per sample)."""
    merge = getattr(context.sub("vision_config"), "spatial_merge_size", 1) or 1
    return torch.full((context.batch,), merge, dtype=torch.long)


def _target_sizes(context: Context) -> torch.Tensor:
    """MiniCPM-V: each image's size in patches, (rows, columns)."""
    return torch.tensor([list(_patch_grid(context))] * context.batch)


def _hidden_states(context: Context) -> torch.Tensor:
    if "grid_thw" in context.parameters:  # a Qwen-style vision tower: the flattened patches of its grid
        grid = _grid_pixel_values(context)
        context.inputs_so_far["image_grid_thw"] = grid["image_grid_thw"]
        context.label_hint = "image"
        return grid["pixel_values"]
    if "quantized_code" in context.parameters:  # the DiT's noisy mel frames, as many as its codes stand for
        return context.randn(context.batch, context.length * context.get("repeats"), context.get("mel_dim"))
    reader = _first_layer(context.model)
    if getattr(context.model, "main_input_name", None) == "pixel_values":  # a vision backbone (Florence-2's DaViT)
        context.label_hint = "image"
        channels, height, width = _image_shape(context)
        if isinstance(reader, torch.nn.Conv2d) and reader.in_channels != channels:  # a head on a backbone's map
            # at the map's size, not the image's: the image's would give a head with attention thousands of tokens
            map_height, map_width = max(height // BACKBONE_MAP_STRIDE, 1), max(width // BACKBONE_MAP_STRIDE, 1)
            return context.randn(context.batch, reader.in_channels, map_height, map_width)
        if isinstance(reader, torch.nn.Linear):  # a head on a backbone's flattened map (SLANet's table decoder)
            return context.randn(context.batch, (height // 4) * (width // 4), reader.in_features)  # at stride 4
        return _pixel_values(context)
    if isinstance(reader, torch.nn.Conv1d):  # a codec's halves alone: the encoder's mono samples, the decoder's frames
        context.label_hint = "audio"
        length = AUDIO_SAMPLES[context.label] if reader.in_channels == 1 else _codec_frames(context)
        return context.randn(context.batch, reader.in_channels, length)
    # input_dim, input_size: an encoder's own input width (Granite Speech's, Phi-4's audio mel bins)
    width = context.get("input_dim") or context.get("input_size") or context.get("hidden_size", 32)
    return context.randn(context.batch, context.length, width)


def _query_embeds(context: Context) -> torch.Tensor:
    """A Q-Former alone: its learned queries, and the image features they read through cross-attention."""
    width = context.get("encoder_hidden_size", 32)
    context.inputs_so_far["encoder_hidden_states"] = context.randn(context.batch, 4, width)
    context.label_hint = "image"
    return context.randn(context.batch, context.length, context.get("hidden_size", 32))


def _feature_mask(context: Context) -> torch.Tensor | None:
    """All frames of the audio features are real: ones over their frame axis."""
    features = context.inputs_so_far.get("input_features")
    if features is None:
        return None
    return torch.ones(features.shape[0], features.shape[context.frame_axis], dtype=torch.long)


def _video(context: Context) -> torch.Tensor:
    context.label_hint = "video"
    return context.randn(context.batch, 4, *_image_shape(context))


def _codec_frames(context: Context) -> int:
    """The frames a codec makes of the raw audio, one per 320 samples."""
    return AUDIO_SAMPLES[context.label] // 320


def _latents(context: Context) -> torch.Tensor:
    """A codec's decoder alone (Mimi's): continuous latents, (batch, hidden_size, frames)."""
    context.label_hint = "audio"
    return context.randn(context.batch, context.get("hidden_size", 32), _codec_frames(context))


def _region_positions(context: Context) -> torch.Tensor:
    """VisualBERT's Flickr head aligns phrases with image regions: four regions, and each position of text and
    regions reads its phrase at its own place."""
    inputs = context.inputs_so_far
    inputs["visual_embeds"] = context.randn(context.batch, 4, context.get("visual_embedding_dim", 32))
    inputs["visual_attention_mask"] = torch.ones(context.batch, 4, dtype=torch.long)
    return torch.arange(inputs["input_ids"].shape[1] + 4).repeat(context.batch, 1)


def _global_attention_mask(context: Context) -> torch.Tensor | None:
    """Longformer: the first token attends globally (question answering would otherwise look for separators)."""
    ids = context.inputs_so_far.get("input_ids")
    if ids is None:
        return None
    mask = torch.zeros(ids.shape[:2], dtype=torch.long)
    mask[:, 0] = 1
    return mask


def _bool_masked_pos(context: Context) -> torch.Tensor | None:
    """Masked-video pre-training (VideoMAE): which patches the decoder reconstructs, half of them, the same count in
    every sample as the model requires."""
    pixels = context.inputs_so_far.get("pixel_values")
    if pixels is None:
        return None
    patch = context.get("patch_size", PATCH)
    patches = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
    if pixels.dim() == 5:  # (batch, frames, C, H, W), frames grouped in tubelets
        patches *= pixels.shape[1] // context.get("tubelet_size", 1)
    order = torch.rand(pixels.shape[0], patches, generator=context.generator).argsort(dim=1)
    return order < patches // 2


def _question_positions(context: Context) -> torch.Tensor | None:
    """Splinter pre-training: where its question tokens stand, two per sample (found from the ids, their count would
    be data). Its question-answering head finds its one question itself (given several, it adds the text mask to
    their logits with mismatched shapes)."""
    ids, question = context.inputs_so_far.get("input_ids"), context.get("question_token_id")
    if ids is None or question is None or not type(context.model).__name__.endswith("ForPreTraining"):
        return None
    positions = torch.tensor([[1, 2]]).repeat(ids.shape[0], 1)
    ids[:, 1:3] = question
    return positions


_AUDIO_INPUTS = ("input_values", "input_features")
_FEATURE_MASKS = ("feature_attention_mask", "input_features_mask")  # which mel frames are real, by either name


def _padding_mask(context: Context) -> torch.Tensor | None:
    """Which raw-audio samples are real, all of them: (batch, samples) of the waveform, or of the mel frames'
    waveform when the model reads features (MOSS maps its audio chunks by it)."""
    waveform, features = context.inputs_so_far.get("input_values"), context.inputs_so_far.get("input_features")
    if waveform is not None:
        return torch.ones(waveform.shape[0], waveform.shape[-1], dtype=torch.long)
    if features is None:
        return None
    return torch.ones(features.shape[0], _samples_behind(context, features), dtype=torch.long)


def _samples_behind(context: Context, features: torch.Tensor) -> int:
    """The waveform samples behind mel frames: hop_length per frame."""
    return features.shape[-1] * context.get("hop_length", 160, "audio_config")


def _chunk_sample_lengths(context: Context) -> torch.Tensor | None:
    """dots.3 note: the waveform samples behind each chunk of mel frames (hop_length per frame), all of them real."""
    features = context.inputs_so_far.get("input_features")
    if features is None:
        return None
    return torch.full((features.shape[0],), _samples_behind(context, features), dtype=torch.long)


def _spectrogram(context: Context) -> torch.Tensor:
    """Vocoders (HiFi-GAN) turn (batch, frames, mel bins) into audio."""
    return context.randn(context.batch, 4 * context.length, context.get("model_in_dim", 80))


_MONO_CODEC = re.compile(r"input_values \(`torch\.\w+` of shape `\(batch_size, 1, \w+\)`")


_PER_PATCH_MASK = re.compile(r"image_attention_mask \(`torch\.\w+` of shape `\(batch_size, image_num_patches\)`")


def _per_patch_image_mask(context: Context) -> bool:
    return bool(_PER_PATCH_MASK.search(type(context.model).forward.__doc__ or ""))


def _raw_audio(context: Context) -> torch.Tensor:
    """Audio codecs take (batch, channels, samples); speech encoders take (batch, samples). A codec without an
    ``audio_channels`` setting says its layout in the forward docstring: ``(batch_size, 1, time_steps)``."""
    channels = getattr(context.config, "audio_channels", None) or RAW_AUDIO_CHANNELS.get(context.config.model_type)
    if channels is None and _MONO_CODEC.search(type(context.model).forward.__doc__ or ""):
        channels = 1
    samples = AUDIO_SAMPLES[context.label]
    per_token = context.get("samples_per_token", 1, "audio_config")  # whole tokens, as its extractor pads (Muse Spark)
    audio = context.randn(context.batch, samples // per_token * per_token) * 0.1
    return audio.unsqueeze(1).expand(-1, channels, -1).contiguous() if isinstance(channels, int) else audio


_TRAJECTORY = {  # decision transformers: one row per timestep
    "states": lambda c: c.randn(c.batch, c.length, c.get("state_dim", 4)),
    # a trajectory's actions go with its states; elsewhere (PI0) actions are training labels
    "actions": lambda c: c.randn(c.batch, c.length, c.get("act_dim", 2)) if "states" in c.parameters else None,
    "returns_to_go": lambda c: c.randn(c.batch, c.length, 1),
    "rewards": lambda c: c.randn(c.batch, c.length, 1),
    "timesteps": lambda c: torch.arange(c.length).expand(c.batch, -1).contiguous(),
}

# flow-matching robot policies (PI0): the robot's state, and the denoising step's time and noisy action chunk
# (`noise`), which the model draws at random when not given
_FLOW_POLICY = {
    "state": lambda c: c.randn(c.batch, c.get("max_state_dim", 8)),
    "timestep": lambda c: torch.rand(c.batch, generator=c.generator),
    # the base model takes them embedded: the state's row, then the action chunk's
    "action_embeds": lambda c: c.randn(c.batch, c.get("chunk_size", 4) + 1, c.get("hidden_size", 32, "dit_config")),
}


# decision heads (JEV): two questions on each prompt, a yes/no and a score, each marked at a token of the text
_DECISIONS = {
    "marks": lambda c: torch.tensor([[c.length // 2, c.length]] * c.batch),  # 1-based: the row before is read
    "num_options": lambda c: torch.full((c.batch, 2), 2),
    "question_type_ids": lambda c: torch.tensor([[0, 1]] * c.batch),
}


def _series_length(context: Context, future: bool = False) -> int:
    config = context.config
    if future:
        return getattr(config, "prediction_length", None) or 8
    lags = getattr(config, "lags_sequence", None)
    return (getattr(config, "context_length", None) or 32) + (max(lags) if lags else 0)


_TIME_SERIES = {  # covariates of probabilistic forecasters, sized like the series they describe
    "past_time_features": lambda c: c.randn(c.batch, _series_length(c), c.get("num_time_features", 1)),
    "future_time_features": lambda c: c.randn(c.batch, _series_length(c, True), c.get("num_time_features", 1)),
    "past_observed_mask": lambda c: torch.ones_like(c.inputs_so_far["past_values"])
    if "past_values" in c.inputs_so_far else None,
    # TimesFM: no step is padding, and one frequency class per series
    "past_values_padding": lambda c: torch.zeros(c.inputs_so_far["past_values"].shape[:2], dtype=torch.long),
    "freq": lambda c: torch.zeros(c.batch, 1, dtype=torch.long),
}

ENTITIES = 2


def _entity_ids(context: Context) -> torch.Tensor:
    vocab = context.get("entity_vocab_size", 8)
    return torch.randint(1, max(2, vocab), (context.batch, ENTITIES), generator=context.generator)


def _entity_positions(context: Context) -> torch.Tensor:
    """Each entity mentions one token; the rest of the mention slots are padding (-1)."""
    width = context.get("max_mention_length", 4)
    positions = torch.full((context.batch, ENTITIES, width), -1, dtype=torch.long)
    positions[:, :, 0] = torch.arange(ENTITIES) + 1
    return positions


_ENTITIES = {  # LUKE: entities next to the words
    "entity_ids": _entity_ids,
    "entity_attention_mask": lambda c: torch.ones(c.batch, ENTITIES, dtype=torch.long),
    "entity_token_type_ids": lambda c: torch.zeros(c.batch, ENTITIES, dtype=torch.long),
    "entity_position_ids": _entity_positions,
    "entity_start_positions": lambda c: torch.arange(ENTITIES).expand(c.batch, -1) + 1,
    "entity_end_positions": lambda c: torch.arange(ENTITIES).expand(c.batch, -1) + 1,
}


def _drafted_block(context: Context) -> torch.Tensor:
    """A block drafter (Muse Glimmer's assistant): the block to denoise, after the target model's states of the
    text so far (its chosen layers side by side), which its attention mask spans too."""
    width = context.get("hidden_size", 32)
    layers = len(context.get("target_layer_ids", [0]))
    context.inputs_so_far["context_hidden_states"] = context.randn(context.batch, context.length, width * layers)
    block = context.get("block_size", 4)
    context.inputs_so_far["attention_mask"] = torch.ones(context.batch, context.length + block, dtype=torch.long)
    return context.randn(context.batch, block, width)


CLASSES_PER_SAMPLE = 2
_CLASS_PROMPTS = {  # OmDet-Turbo: the class names each image is searched for, all samples' in one batch, and a task
    "classes_input_ids": lambda c: c.tokens(batch=c.batch * CLASSES_PER_SAMPLE),
    "classes_attention_mask": lambda c: torch.ones(c.batch * CLASSES_PER_SAMPLE, c.length, dtype=torch.long),
    "classes_structure": lambda c: torch.full((c.batch,), CLASSES_PER_SAMPLE),
    "tasks_input_ids": lambda c: c.tokens(),
    "tasks_attention_mask": lambda c: torch.ones(c.batch, c.length, dtype=torch.long),
}


_RETRIEVED = {  # RAG without its retriever (an index it would download): the passages it would have retrieved
    "context_input_ids": lambda c: c.tokens(batch=c.batch * c.get("n_docs", 1)),
    "context_attention_mask": lambda c: torch.ones(c.batch * c.get("n_docs", 1), c.length, dtype=torch.long),
    "doc_scores": lambda c: c.randn(c.batch, c.get("n_docs", 1)),
}

_MEL_FLOW = {  # Qwen2.5-Omni's token-to-wav DiT alone: one flow step over the mel frames its speech codes stand for
    "quantized_code": lambda c: torch.randint(0, c.get("num_embeds"), (c.batch, c.length), generator=c.generator),
    "condition_vector": lambda c: c.randn(c.batch, 4 * c.length, c.get("mel_dim")),  # the reference voice's mel
    "speaker_embedding": lambda c: c.randn(c.batch, c.length * c.get("repeats"), c.get("enc_emb_dim")),
    "time_step": lambda c: torch.rand(c.batch, generator=c.generator),
}

_TOKEN_TO_WAV = {  # Qwen2.5-Omni's token-to-wav whole: speech codes, the voice's embedding and its reference mel
    "code": lambda c: torch.randint(0, c.get("num_embeds", None, "dit_config"), (c.batch, c.length), generator=c.generator),
    "conditioning": lambda c: c.randn(c.batch, c.get("enc_emb_dim", None, "dit_config")),
    "reference_mel": lambda c: c.randn(c.batch, 4 * c.length, c.get("mel_dim", None, "dit_config")),
}

_AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
# per-atom features of a protein's reference conformer, which ESMFold 2 takes bundled in one dataclass
_ATOM_FIELDS = ("ref_pos", "ref_charge", "atom_attention_mask", "ref_element", "ref_atom_name_chars", "ref_space_uid",
                "atom_to_token")


def _protein_tokens(context: Context) -> torch.Tensor:
    """ESMFold 2's trunk: random proteins featurized by transformers' own featurizer, one per sample, their atom
    lists padded to the longest as masked atoms. Fills every per-token, per-atom and language-model input."""
    from transformers.models.esmfold2 import modeling_esmfold2, protein_utils

    picks = torch.randint(len(_AMINO_ACIDS), (context.batch, context.length), generator=context.generator)
    samples = [protein_utils.prepare_protein_features("".join(_AMINO_ACIDS[i] for i in row)) for row in picks.tolist()]
    atoms = max(sample["ref_pos"].shape[1] for sample in samples)
    for sample in samples:
        for name in _ATOM_FIELDS:
            value = sample[name]
            pad = [0, 0] * (value.dim() - 2) + [0, atoms - value.shape[1]]
            sample[name] = torch.nn.functional.pad(value, pad)
    features = {name: torch.cat([sample[name] for sample in samples]) for name in samples[0]}
    context.inputs_so_far.update({name: value for name, value in features.items() if name in context.parameters})
    context.inputs_so_far["atom_inputs"] = modeling_esmfold2.EsmFold2AtomInputs(
        **{name: features[name] for name in _ATOM_FIELDS}
    )
    return features["token_index"]


_RULES: dict[str, Callable[[Context], Any]] = {
    **_TRAJECTORY,
    "token_index": _protein_tokens,
    **_MEL_FLOW,
    **_TOKEN_TO_WAV,
    **_RETRIEVED,
    **_CLASS_PROMPTS,
    **_FLOW_POLICY,
    **_DECISIONS,
    **_ENTITIES,
    "spkr_id": lambda context: torch.zeros(context.batch, 1, dtype=torch.long),
    "lang_id": lambda context: torch.zeros(context.batch, 1, dtype=torch.long),
    **_TIME_SERIES,
    "image_sizes": _image_sizes,
    "grid_thw": _grid_thw,
    "image_grid_thw": _grid_thw,
    "image_grid_hw": lambda context: _grid_thw(context)[:, 1:],  # one frame: the grid's rows and columns
    # DeepSeek-VL hybrid: the same image again for its high-resolution (SAM) tower
    "high_res_pixel_values": lambda c: c.randn(c.batch, 3, *[c.get("image_size", IMAGE, "high_res_vision_config")] * 2),
    "image_merge_sizes": _merge_sizes,
    "image_token_pooling": _pooled_patches,
    "pooled_patches_idx": _pooled_patches,  # Molmo 2's adapter alone: the same indices, into its ViT features
    # and the ViT features it pools: those of the layers it reads, side by side
    "image_features": lambda c: c.randn(c.batch, math.prod(_patch_grid(c)),
                                        c.get("hidden_size", 32) * len(c.get("vision_feature_layer", [-1]))),
    # tokens per image: a low-resolution grid (the 2 x 2 blocks pooled here) and a high-resolution one (none)
    "image_grids": lambda c: torch.tensor([[math.prod(_patch_grid(c)) // 4, 1, 0, 0]] * c.batch),
    "image_num_crops": lambda c: torch.ones(c.batch, dtype=torch.long),
    "merge_sizes": _merge_sizes,
    "target_sizes": _target_sizes,
    "hidden_states": _hidden_states,
    # Qwen2.5-Omni's talker speaks the thinker's reply: its hidden states, and its text for rotary positions
    "thinker_reply_part": lambda c: c.randn(c.batch, c.length, c.get("embedding_size", 32)),
    "input_text_ids": lambda context: context.inputs_so_far.get("input_ids"),
    "inputs_embeds": lambda context: context.randn(context.batch, context.length, context.get("hidden_size", 32)),
    "query_embeds": _query_embeds,
    "noise_embeds": _drafted_block,
    "t_cond": lambda context: context.randn(1, 1, context.config.hidden_size),  # one delay: broadcast over the batch
    "past_key_values": lambda context: _encoder_prefix_cache(context),
    "subsampled_output_points": lambda context: _perceiver_output_points(context),
    "spectrogram": _spectrogram,
    # BigVGAN (the Qwen2.5-Omni vocoder): mel bins first
    "mel_spectrogram": lambda context: context.randn(context.batch, context.get("mel_dim", 80), 4 * context.length),
    "audio_mel": lambda context: context.randn(context.batch, 64, context.get("input_feat_size", 128)),
    "audio_mel_mask": lambda context: torch.zeros(*context.inputs_so_far["audio_mel"].shape[:2], dtype=torch.bool),
    # speech encoder-decoders' encoder input; Perceiver names its main input so too
    "inputs": lambda context: _raw_audio(context) if _inputs_are_audio(context.model) else _perceiver_inputs(context),
    "pixel_values_videos": _video,
    "speaker_embeddings": lambda context: context.randn(context.batch, context.get("speaker_embedding_dim", 512)),
    "input_features_mask": lambda context: _feature_mask(context),
    "chunk_sample_lengths": _chunk_sample_lengths,
    "padding_mask": _padding_mask,
    "feature_attention_mask": lambda context: _feature_mask(context),
    "decoder_input_values": _decoder_input_values,
    "global_attention_mask": _global_attention_mask,
    "noise": _noise,
    # OneFormer's task prompt ("the task is semantic"), tokenised to its fixed length
    "task_inputs": lambda c: c.tokens(length=c.get("task_seq_len")),
    # a vocoder's noise beside its spectrogram (UnivNet), which it draws at random when not given
    "noise_sequence": lambda c: c.randn(c.batch, c.inputs_so_far["input_features"].shape[1],
                                        c.get("model_in_channels")),
    "bool_masked_pos": _bool_masked_pos,
    "question_positions": _question_positions,
    # which images each text token sees (IDEFICS); left out where it masks an image's patches, all real here
    "image_attention_mask": lambda context: torch.ones(*context.inputs_so_far["input_ids"].shape[:2], 1, dtype=torch.long)
    if "input_ids" in context.inputs_so_far and not _per_patch_image_mask(context) else None,
    "lang_ids": lambda context: torch.zeros(context.batch, dtype=torch.long),
    "qformer_input_ids": lambda context: context.tokens(),
    "visual_feats": lambda context: context.randn(context.batch, 4, context.get("visual_feat_dim", 32)),
    "region_to_phrase_position": _region_positions,
    "latents": _latents,
    "visual_pos": lambda context: torch.rand(context.batch, 4, context.get("visual_pos_dim", 4), generator=context.generator),
    "input_ids": _input_ids,
    "attention_mask": _attention_mask,
    "token_type_ids": _token_type_ids,
    "decoder_input_ids": _decoder_input_ids,
    "pixel_values": _pixel_values,
    # SegGPT's in-context example: an image and its segmentation, drawn as images
    "prompt_pixel_values": _pixel_values,
    "prompt_masks": _pixel_values,
    "flattened_patches": _flattened_patches,
    "image_embeds_position_mask": _image_embeds_position_mask,
    "input_features": _input_features,
    "input_values": _input_values,
    "audio_input_ids": _audio_codes,
    "moshi_audio_codes": _moshi_codes,
    "user_audio_codes": _moshi_codes,
    "codebook_idx": lambda context: 1,  # which codebook a fine acoustic model predicts: a constant
    # a model that samples its audio latents unless told not to (VibeVoice's VAE): eager and export take the mean
    "sample": lambda context: False if context.parameters["sample"].default is True else None,
    # a pre-training head whose config asks for its loss (FLAVA) would need labels: the outputs alone
    "return_loss": lambda context: False if getattr(context.config, "return_loss", None) else None,
    "bbox": _bbox,
    "past_values": _past_values,
}

# Filled whenever the forward takes them, required or not: callers pass them, and they switch on code paths.
_ALWAYS = ("attention_mask", "token_type_ids", "decoder_input_ids", "pixel_values", "bbox", "noise", "noise_sequence",
           "lang_ids", "visual_feats", "visual_pos", "image_attention_mask", "global_attention_mask", "target_sizes",
           "grid_thw", "input_features", "decoder_input_values", "thinker_reply_part", "input_text_ids",
           "flattened_patches", "image_embeds_position_mask", "image_grid_hw", "high_res_pixel_values", "sample",
           "return_loss", "question_positions", "timestep", "region_to_phrase_position", "moshi_audio_codes",
           "user_audio_codes", *_TRAJECTORY, *_ENTITIES, *_RETRIEVED)
# inputs a forward needs that its signature does not require: optional there, or taken only through `**kwargs`
_NEEDED_UNDECLARED = {
    "VoxtralRealtimeTextModel": ("t_cond",),  # the delay's time embedding its composite computes
    "DiffusionGemmaDecoderModel": ("past_key_values",),  # the encoder's keys and values of the prompt
    "PerceiverForMultimodalAutoencoding": ("subsampled_output_points",),  # which outputs to decode
}


def _parameters(model) -> dict[str, inspect.Parameter]:
    return {
        name: parameter
        for name, parameter in inspect.signature(model.forward).parameters.items()
        if parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }


def _accepts_none(parameter: inspect.Parameter) -> bool:
    annotation = parameter.annotation
    if isinstance(annotation, str):
        return "None" in annotation or "Optional" in annotation
    return type(None) in get_args(annotation)


def make_inputs(model, label: str = "A", seed: int = 0) -> tuple[dict[str, Any], str]:
    """``(inputs, input set name)`` for input set ``label``: keyword tensors for ``model(**inputs)``."""
    batch, length = INPUT_SIZES[label]
    if model.config.model_type in ONE_SAMPLE_BATCH:
        batch = 1
    parameters = _parameters(model)
    context = Context(
        model, model.config, batch, length, label, torch.Generator().manual_seed(seed), parameters,
        special_token_ids(model.config),
    )  # fmt: skip
    inputs = context.inputs_so_far
    alone = MAIN_INPUTS.get(type(model).__name__)
    main = alone or getattr(model, "main_input_name", "input_ids")
    main = main[0] if isinstance(main, (list, tuple)) else main
    wanted = [main] if main in parameters else []
    for name, parameter in parameters.items():
        required = parameter.default is inspect.Parameter.empty
        text_beside = (name == "input_ids" and main not in ("input_ids", "inputs_embeds") and not alone
                       and _takes_text(model))
        # an audio encoder alone may count its frames by the mask it declares optional (Audio Flamingo 3's)
        frame_mask = name in _FEATURE_MASKS and main == "input_features"
        other_audio = alone in _AUDIO_INPUTS and name in _AUDIO_INPUTS  # samples or features, one of them
        if name not in wanted and not other_audio and (required or name in _ALWAYS or text_beside or frame_mask):
            wanted.append(name)
    wanted += [name for name in _NEEDED_UNDECLARED.get(type(model).__name__, ()) if name not in wanted]
    for name in wanted:
        rule = _RULES.get(name)
        if rule is None:
            if parameters[name].default is inspect.Parameter.empty and name not in inputs:  # set by another rule
                if _accepts_none(parameters[name]):  # required, but None is an answer (Phi-4's audio mask)
                    inputs[name] = None
                    continue
                raise InputError(f"no input rule for the required forward argument {name!r} of {type(model).__name__}")
            continue
        value = rule(context)
        if value is not None:
            inputs[name] = value
    # audio language models read mel features, or raw samples when that is all their forward takes (VibeVoice ASR)
    raw_audio_only = "input_values" in parameters and "input_features" not in parameters
    audio_input = "input_values" if raw_audio_only else "input_features"
    for modality, feature_input in (("image", "pixel_values"), ("audio", audio_input)):
        placeholder = _placeholder_token(model.config, modality)
        tower = "vision_config" if modality == "image" else "audio_config"
        if placeholder is None or "input_ids" not in inputs or _configured_away(model.config, tower):
            continue
        if modality == "audio" and inputs["input_ids"].dim() > 2:  # audio codes per position already (CSM)
            continue
        has_features = _features_owner(model, modality) is not None
        queries = getattr(model.config, "num_query_tokens", None)
        if not has_features and modality == "image" and queries and feature_input in inputs:
            # BLIP-2's retrieval head: its processor puts a placeholder per query before the text, which it cuts off
            _prepend_placeholders(context, inputs, placeholder, queries)
            continue
        if not has_features:
            if modality == "audio" and feature_input in parameters:  # Qwen2-Audio: its tower counts the tokens
                inputs[feature_input] = _RULES[feature_input](context)
                for name in _FEATURE_MASKS:
                    if name in parameters:
                        inputs[name] = _feature_mask(context)
                count = _audio_tokens_per_sample(model, inputs)
                if count:  # expanded as its processor does; the one placeholder it expands itself does not trace
                    _prepend_placeholders(context, inputs, placeholder, count)
                else:
                    inputs["input_ids"][:, 0] = placeholder
            continue
        if feature_input not in inputs and feature_input in parameters and modality == "audio":
            inputs[feature_input] = _RULES[feature_input](context)  # audio language models: sound next to the text
        if feature_input in inputs:
            _place_placeholders(context, inputs, modality)
    if "images_per_sample" in parameters and "image_grid_thw" in inputs:
        _add_target_grids(inputs)
    if "position_ids" in parameters and "input_ids" in inputs:
        _multimodal_positions(model, inputs)
    eos = getattr(model.config, "eos_token_id", None)
    if type(model).__name__.endswith("ForSequenceClassification") and isinstance(eos, int) and "input_ids" in inputs:
        inputs["input_ids"][:, -1] = eos  # encoder-decoder classifiers pool the hidden state at <eos>
    if type(model).__name__.endswith("ForMultipleChoice"):  # every sample is NUM_CHOICES sequences
        for name in ("input_ids", "attention_mask", "token_type_ids", "global_attention_mask", *_ENTITIES):
            if name in inputs:
                value = inputs[name]
                inputs[name] = value.unsqueeze(1).expand(-1, NUM_CHOICES, *value.shape[1:]).contiguous()
        if "lang_ids" in inputs:  # X-MOD's choice head repeats one language id over every sequence
            inputs["lang_ids"] = inputs["lang_ids"][:1]
    _vision_precomputed(model, inputs)
    modalities = [MODALITY_INPUTS[name] for name in inputs
                  if name in MODALITY_INPUTS and (name != "inputs" or _inputs_are_audio(model))]
    if context.label_hint == "video":
        modalities = ["video" if m == "image" else m for m in modalities]
    elif context.label_hint and not modalities:  # an image fed under a generic name (hidden_states)
        modalities = [context.label_hint]
    if "input_ids" in inputs or "decoder_input_ids" in inputs:
        modalities.insert(0, "text")
    return inputs, "+".join(dict.fromkeys(modalities)) or "other"


def _add_target_grids(inputs: dict) -> None:
    """GLM-Image edits an image into a new one: each sample's grids are its source image's, then the grid of the
    image to generate, which positions the answer and which its vision tower never sees."""
    sources = inputs["image_grid_thw"]
    inputs["image_grid_thw"] = torch.stack([sources, sources], dim=1).flatten(0, 1)
    inputs["images_per_sample"] = torch.full((len(sources),), 2)


def _multimodal_positions(model, inputs: dict) -> None:
    """Qwen-VL-style models place image tokens on a 3-D rotary grid computed by looping over each sample's images,
    a loop over tensor values torch.export cannot trace. A runner computes these positions next to the processor;
    so do the inputs, with the model's own `compute_3d_position_ids`."""
    owner = next((module for module in model.modules() if hasattr(module, "compute_3d_position_ids")), None)
    if owner is None or (_image_grid(inputs) is None and "target_sizes" not in inputs):  # no image geometry given
        return
    accepted = inspect.signature(owner.compute_3d_position_ids).parameters
    arguments = {name: value for name, value in inputs.items() if name in accepted}
    if "mm_token_type_ids" in accepted and "mm_token_type_ids" not in arguments and "input_ids" in inputs:
        # a retriever (ColQwen2) feeds its VLM embeddings, not these: the positions still need them
        arguments["mm_token_type_ids"] = _token_types(model.config, inputs["input_ids"])
    for name, parameter in accepted.items():
        if name in arguments or parameter.default is not inspect.Parameter.empty or name == "self":
            continue
        if "None" not in str(parameter.annotation):  # GLM-Image counts images per sample: left in the graph
            return
        arguments[name] = None  # spelled out with no default (Qwen2.5-VL's past_key_values)
    saved = getattr(owner, "rope_deltas", None)
    with torch.no_grad():
        positions = owner.compute_3d_position_ids(**arguments)
    owner.rope_deltas = saved  # computing them stores the offsets generation would reuse
    if positions is not None:
        inputs["position_ids"] = positions


def _vision_precomputed(model, inputs: dict) -> None:
    """Vision towers derive their patch positions, attention boundaries, windows and position-embedding taps from
    the image grid with Python loops, `tolist()` and `repeat_interleave`: untraceable, an image count the trace
    fixes, or a length ExecuTorch has no kernel for. Their `get_vision_*` helpers (transformers' `vision_utils`, or
    the model's own) take the result precomputed under a kwarg, as a runner computes it beside the processor: one
    eager call records what the model computes for these inputs, and the inputs feed it. Not a helper called twice
    (a tower run on images and on videos). A composite model hands its kwargs to both halves, and text layers would
    take `cu_seqlens` for packed sequences: a name its language model reads too is fed under the prefix of the
    helper's modality (``image_``, ``audio_``), which only that modality's features strip, or not at all."""
    if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(model.forward).parameters.values()):
        return
    helpers = _vision_helpers(model)
    if not helpers:
        return
    tower_alone = not any(getattr(model.config, part, None) is not None for part in ("text_config", "vision_config"))
    calls: dict[Callable, list] = {helper: [] for helper in helpers}
    with _recording(helpers, calls), torch.no_grad():
        model(**inputs)
    for helper, results in calls.items():
        keys = helpers[helper][1]
        modality = "audio" if helper.__name__.startswith("get_audio_") else "image"
        prefixed = _features_take_prefixed_kwargs(model, modality)
        shared_prefix = "" if tower_alone else f"{modality}_" if prefixed else None
        if shared_prefix is None and any(key in _TEXT_KWARGS for key in keys):
            continue
        keys = tuple(shared_prefix + key if key in _TEXT_KWARGS else key for key in keys)
        if len(results) != 1 or any(key in inputs for key in keys):
            continue
        values = results[0] if len(keys) > 1 else (results[0],)
        if len(values) == len(keys) and all(isinstance(value, torch.Tensor) for value in values):
            inputs.update(zip(keys, values))


def _features_take_prefixed_kwargs(model, modality: str) -> bool:
    """Whether the model's `get_<modality>_features` takes precomputed tower kwargs under a ``<modality>_`` prefix
    (transformers' `accepts_precomputed_kwargs`), so that the language model, handed the same kwargs, ignores them."""
    from transformers.utils.generic import accepts_precomputed_kwargs

    for module in model.modules():
        method = getattr(type(module), f"get_{modality}_features", None)
        code = getattr(method, "__code__", None)
        if code is not None and code.co_qualname.startswith(accepts_precomputed_kwargs.__qualname__ + "."):
            return inspect.getclosurevars(method).nonlocals.get("prefix") == f"{modality}_"
    return False


_TEXT_KWARGS = {"cu_seqlens", "position_ids"}
_HELPER_PREFIXES = ("get_vision_", "get_audio_")  # the Qwen audio towers window their frames so too
_POPPED_KWARG = re.compile(r"""kwargs\.pop\(["'](\w+)["']""")


def _vision_helpers(model) -> dict[Callable, tuple[list, tuple[str, ...]]]:
    """``helper -> ([(module, name) it is reached by], kwargs it pops)`` for every ``get_vision_*`` (and
    ``get_audio_*``) function of ``vision_utils`` and of the model's own modules that takes its result precomputed."""
    from transformers import vision_utils

    def functions(module):
        return [(name, f) for name, f in vars(module).items()
                if name.startswith(_HELPER_PREFIXES) and inspect.isfunction(f)]

    modules = {sys.modules[type(m).__module__] for m in model.modules()}
    if not any(functions(module) for module in modules):
        return {}
    helpers: dict[Callable, tuple[list, tuple[str, ...]]] = {}
    # its helpers call one another; a set's order changes with the process's hash seed
    for module in sorted(modules | {vision_utils}, key=lambda module: module.__name__):
        for name, function in functions(module):
            if function not in helpers:
                keys = tuple(_POPPED_KWARG.findall(inspect.getsource(function)))
                if not keys:
                    continue
                helpers[function] = ([], keys)
            helpers[function][0].append((module, name))
    return helpers


@contextmanager
def _recording(helpers: dict, calls: dict[Callable, list]):
    """Each helper records its results in ``calls`` wherever it is reached, while the context lasts."""
    installed = []
    for helper, (places, _) in helpers.items():

        def recording(*args, _helper=helper, **kwargs):
            result = _helper(*args, **kwargs)
            calls[_helper].append(result)
            return result

        for module, name in places:
            setattr(module, name, recording)
            installed.append((module, name, helper))
    try:
        yield
    finally:
        for module, name, helper in installed:
            setattr(module, name, helper)


def _image_grid(inputs: dict):
    """The patch grid of the images or videos among the inputs (`grid_thw`, `image_grid_thw`, ...), if any."""
    return next((value for name, value in inputs.items() if name.endswith("grid_thw")), None)


def _inputs_are_audio(model) -> bool:
    return model.config.model_type != "perceiver"  # its generic `inputs` carry whatever its preprocessor reads


def _encoder_prefix_cache(context: Context):
    """Diffusion Gemma's decoder reads the prompt's keys and values from the cache its encoder filled: as many
    random ones as the canvas has tokens, in each layer's shape."""
    from transformers import DynamicCache

    text = getattr(context.config, "text_config", None)
    if text is None or not hasattr(context.model, "layers"):  # the name alone says nothing about another model's
        raise InputError(f"no input rule for the cache {type(context.model).__name__} reads")
    cache = DynamicCache(config=text)
    for index, layer in enumerate(context.model.layers[: text.num_hidden_layers]):
        attention = layer.self_attn
        shape = (context.batch, attention.k_proj.out_features // attention.head_dim, context.length, attention.head_dim)
        cache.update(context.randn(*shape), context.randn(*shape), index)
    for layer in cache.layers:  # a sliding layer keeps a view of its window: a layout an export would require
        layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
    return cache


def _perceiver_inputs(context: Context) -> torch.Tensor | dict | None:
    """What a Perceiver's preprocessor reads; beside `input_ids` or `pixel_values` those are fed instead."""
    if {"input_ids", "pixel_values"} & set(context.parameters):
        return None
    preprocessor = getattr(context.model, "perceiver", context.model).input_preprocessor
    if preprocessor is None:  # the bare model: states of its width
        return context.randn(context.batch, context.length, context.config.d_model)
    if getattr(preprocessor, "prep_type", None) == "patches" and preprocessor.temporal_downsample == 2:
        context.label_hint = "image"  # optical flow: two frames, each pixel with its 3 x 3 neighbourhood's channels
        return context.randn(context.batch, 2, 27, *context.config.train_size)
    config = context.config  # multimodal autoencoding: a video, its sound, and a label (masked out)
    context.label_hint = "video+audio"
    return {"audio": context.randn(context.batch, config.num_frames * config.audio_samples_per_frame, 1),
            "image": context.randn(context.batch, config.num_frames, 3, config.image_size, config.image_size),
            "label": torch.zeros(context.batch, config.num_labels)}


def _perceiver_output_points(context: Context) -> dict:
    """Multimodal autoencoding decodes a chunk of the video's pixels and of its audio patches per call, as its card
    loops over them (decoding every point at once runs out of memory): here the first 16 of each; the label whole."""
    return {"audio": torch.arange(16), "image": torch.arange(16)}


def unfed_modalities(model, inputs: dict) -> list[str]:
    """Image, video or audio inputs the forward takes, and could use, that these inputs leave out.

    Text-only inputs to a vision-language model run only its language half: that is not a pass.
    A tower configured away (``vision_config=None``) is not missed.
    """
    parameters = _parameters(model)
    towers = {"image": "vision_config", "video": "vision_config", "audio": "audio_config"}
    missing = []
    for name, modality in MODALITY_INPUTS.items():
        if name not in parameters or name in inputs or modality not in towers:
            continue
        tower = towers[modality]
        if tower in vars(model.config) and model.config.__dict__[tower] is None:
            continue
        codes_fed = ("decoder_input_ids" in inputs and _decoder_codebooks(model.config)  # an audio prompt makes them
                     or "input_ids" in inputs and inputs["input_ids"].dim() > 2)
        if modality == "audio" and name == "input_values" and ("input_features" in inputs or codes_fed):
            continue
        if name == "inputs" and not _inputs_are_audio(model):
            continue
        missing.append(name)
    fed = any(name in MODALITY_INPUTS for name in inputs)
    return [] if fed else missing  # one branch beside the text is enough; none is not


# ── Vision-language models: pixel inputs and their placeholder tokens ─────────


def _placeholder_token(config, modality: str) -> int | None:
    for owner in (config, getattr(config, "vlm_config", None)):  # retrievers (ColPali) wrap a whole VLM
        for key in (f"{modality}_token_id", f"{modality}_token_index"):
            value = getattr(owner, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _grid_pixel_values(context: Context) -> dict[str, torch.Tensor]:
    """Qwen-VL style: every image as flattened patches plus its (t, h, w) patch grid."""
    vision = context.sub("vision_config")
    patch = getattr(vision, "patch_size", 14)
    temporal = getattr(vision, "temporal_patch_size", None) or getattr(vision, "patch_temporal", None) or 1
    merge = getattr(vision, "spatial_merge_size", 1) or 1
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", None) or 3
    side = 2 * merge
    rows = context.batch * side * side
    layout = PIXEL_LAYOUTS.get(context.config.model_type)
    pixels = context.randn(rows, channels * temporal * patch * patch)  # flattened: the tower reshapes them
    if layout in ("grid-images", "batched-grid-images"):  # each patch a small image
        pixels = pixels.reshape(rows, channels, patch, patch)
    if layout == "batched-grid-images":
        pixels = pixels.unsqueeze(0)
    elif layout == "padded-patches":  # each image's patches in its own row, padded to the longest
        pixels = pixels.reshape(context.batch, rows // context.batch, -1)
    elif layout == "merged-blocks":  # each merged block of patches as a small channels-last image
        pixels = context.randn(rows // (merge * merge), merge * patch, merge * patch, channels)
        side //= merge  # and the grid counted in blocks
    return {"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, side, side]] * context.batch)}


def _encoder_of(model):
    try:
        return model.get_encoder()
    except Exception:  # decoder-only models have none, some raise
        return None


def _features_owner(model, modality: str):
    """``get_<modality>_features`` of the model, or of its inner ``model`` or encoder when the outer one forwards
    what its signature does not name (``*args``, or fewer parameters than the inner one requires)."""
    method = f"get_{modality}_features"
    inner = getattr(model, "model", None)
    # the encoder: T5Gemma 2's classifiers; the wrapped VLM: retrievers (ColPali), robot policies (PI0, one down)
    owners = (model, inner, _encoder_of(model), getattr(model, "vlm", None), getattr(inner, "vlm", None))
    found = [getattr(owner, method) for owner in owners if hasattr(owner, method)]

    def named(candidate) -> int:
        parameters = inspect.signature(candidate).parameters.values()
        if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
            return -1
        return sum(parameter.kind is not inspect.Parameter.VAR_KEYWORD for parameter in parameters)

    return max(found, key=named) if found else None


def _feature_count(features) -> int:
    """How many feature vectors a ``get_*_features`` call returned, whatever shape its answer takes."""
    if not isinstance(features, (torch.Tensor, tuple, list)):  # a model output: the pooled features, else the states
        pooled, states = getattr(features, "pooler_output", None), features.last_hidden_state
        if pooled is not None or states is not None:
            features = pooled if pooled is not None else states
        else:  # Granite 4 Vision: the features of each text layer they are injected into, as many for every layer
            features = features.deepstack_features[0][1]
    elif isinstance(features, tuple) and len(features) and isinstance(features[0], torch.Tensor) and features[0].dim() == 3:
        features = features[0]
    if isinstance(features, (tuple, list)):
        return sum(feature.shape[:-1].numel() for feature in features)
    return features.shape[:-1].numel()


def _place_placeholders(context: Context, inputs: dict, modality: str) -> None:
    """Put one placeholder token per image (or audio) feature at the start of every sample's text: as many as the
    model's own ``get_<modality>_features`` returns for these inputs."""
    if modality == "image" and "image_grid_thw" in context.parameters:
        inputs.update(_grid_pixel_values(context))
    features = _features_owner(context.model, modality)
    accepted = inspect.signature(features).parameters
    for name, parameter in accepted.items():  # what the feature path needs although the forward makes it optional
        needed = parameter.default is inspect.Parameter.empty or (name in _FEATURE_MASKS and name in context.parameters)
        if needed and name not in inputs and name in _RULES:
            value = _RULES[name](context)
            if value is not None:
                inputs[name] = value
    needs_text = "input_ids" in accepted and accepted["input_ids"].default is inspect.Parameter.empty
    if needs_text and modality == "audio":  # the features read the placeholders (Music Flamingo's timestamps)
        per_sample = _audio_tokens_per_sample(context.model, inputs)
        if per_sample is None:
            raise InputError(f"the audio features of {type(context.model).__name__} read the placeholders, and its "
                             "audio tower has no length rule to count them by")
    else:
        arguments = {k: v for k, v in inputs.items() if k in accepted and k != "input_ids"}
        flagged = PIXEL_LAYOUTS.get(context.config.model_type) == "flagged-images"
        if flagged and "pixel_values" in arguments and "pixel_attention_mask" not in accepted:
            # the flagged images of every sample, counted by a VLM that reads single images (PI0's)
            arguments["pixel_values"] = arguments["pixel_values"].flatten(0, 1)
        with torch.no_grad():
            answer = features(**arguments)
            tokenizer = getattr(features.__self__, "get_image_tokens", None) if modality == "image" else None
            if tokenizer is not None and "hidden_states" in inspect.signature(tokenizer).parameters:
                # GLM-Image quantizes the features: a codebook token per placeholder
                count = tokenizer(answer.pooler_output).numel()
            else:
                count = _feature_count(answer)
        per_sample = count // context.batch
    _prepend_placeholders(context, inputs, _placeholder_token(context.config, modality), per_sample)
    if "mm_token_type_ids" in context.parameters:
        inputs["mm_token_type_ids"] = _token_types(context.config, inputs["input_ids"])


def _prepend_placeholders(context: Context, inputs: dict, token: int, count: int) -> None:
    placeholders = torch.full((context.batch, count), token, dtype=torch.long)
    inputs["input_ids"] = torch.cat([placeholders, inputs["input_ids"]], dim=1)
    for name in ("attention_mask", "token_type_ids"):  # as long as the text now is
        if name in inputs:
            inputs[name] = _RULES[name](context)


def _audio_tokens_per_sample(model, inputs: dict) -> int | None:
    """The audio tokens of each sample by the audio tower's own length rule, for a model without a
    ``get_audio_features`` to count them; None when it has no rule, or the samples differ."""
    tower = getattr(model, "audio_tower", None) or getattr(getattr(model, "model", None), "audio_tower", None)
    mask = next((inputs[name] for name in _FEATURE_MASKS if name in inputs), None)
    if mask is None or not hasattr(tower, "_get_feat_extract_output_lengths"):
        return None
    lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
    lengths = lengths[-1] if isinstance(lengths, tuple) else lengths
    return int(lengths[0]) if bool((lengths == lengths[0]).all()) else None


def _token_types(config, input_ids: torch.Tensor) -> torch.Tensor:
    """0 text, 1 image, 2 video: what multimodal rotary positions read to tell placeholders from text."""
    return (input_ids == _placeholder_token(config, "image")).to(torch.int)


def _takes_text(model) -> bool:
    """Multimodal models whose main input is an image or audio but that also read text (CLIP, Whisper decoders)."""
    config = vars(model.config)
    wrapped = config.get("text_config") or config.get("vlm_config")
    return bool(wrapped) or any(key.endswith("vocab_size") for key in config)
