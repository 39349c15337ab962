"""The small modules the workaround tests export, each the smallest model of one PyTorch pattern, and the
helpers that export them; every backend's workarounds are registered when this module is imported."""

import math

import pytest
import torch

import exporters
from exporters.workarounds import disabled_workarounds, load_registrations

from ..conftest import TOLERANCE, assert_parity

load_registrations()  # apply_patches below installs what is registered, of every backend


def export_module(model, inputs, backend, dynamic=False):
    exporter, config = exporters.exporter_for(backend, dynamic=dynamic)
    return exporter.export(model, inputs, config)


def export_tiny(tiny_model, backend, dynamic=False):
    return export_module(tiny_model.model, tiny_model.inputs["A"], backend, dynamic)


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        return self.projection(tokens)


class ExpertCapacity(torch.nn.Module):
    """NLLB-MoE's router: each expert takes the tokens ranked below a capacity, a fraction of the token count."""

    def forward(self, tokens):
        capacity = math.ceil(0.75 * tokens.shape[0] * tokens.shape[1])
        ranks = torch.arange(tokens.shape[0] * tokens.shape[1]).reshape(tokens.shape[:2])
        return tokens * torch.lt(ranks, capacity)[..., None]


class FusedProjection(torch.nn.Module):
    """CodeGen's attention: one projection split into queries, keys and values (an op returning Tensor[])."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 12)

    def forward(self, tokens):
        query, key, value = self.projection(tokens).split(4, dim=-1)
        return query * key + value


class ExpandedKeys(torch.nn.Module):
    """DeepSeek-V2's MLA attention: keys assembled into a `new_empty` of (batch, length, width)."""

    def forward(self, tokens):
        keys = tokens.new_empty((tokens.shape[0], tokens.shape[1], 8))
        keys[..., :4] = tokens
        keys[..., 4:] = tokens * 2
        return keys


def executorch_dynamic(model, inputs):
    return export_module(model, inputs, "executorch", dynamic=True)


TOKENS = {"A": {"tokens": torch.randn(2, 7, 4)}, "B": {"tokens": torch.randn(3, 5, 4)}}


def assert_runs_like_eager(exported, model, inputs):
    torch.testing.assert_close(exported(**inputs)["output"], model(**inputs), atol=1e-5, rtol=1e-5)


class PositionedAttention(torch.nn.Module):
    """FastSpeech2's encoder: positions read from a long table (which bounds the sequence at its length), then
    scores of every position against every other, the square of the sequence."""

    def __init__(self, positions: int = 2048):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(positions, 4))

    def forward(self, tokens):
        hidden = tokens + self.table[: tokens.shape[1]]
        return (hidden @ hidden.transpose(1, 2)).softmax(-1) @ hidden


class FramedSamples(torch.nn.Module):
    """X-Codec 2 reads raw samples beside their features, a fixed number of samples per frame (320; 20 here): the
    samples' axis is an expression of the frames' symbol, at least 40 for the two frames an axis has at least."""

    def forward(self, samples, features):
        return samples.view(samples.shape[0], features.shape[1], 20) + features


class RepeatedByCounts(torch.nn.Module):
    """SeamlessM4T's vocoder: each unit repeated for its predicted duration, a length read from data."""

    def forward(self, tokens, counts):
        return tokens.repeat_interleave(counts, dim=0) * 2


class AntialiasedResize(torch.nn.Module):
    """UnlimitedOCR's tower: its position grid resized (bicubic, antialiased) to the patch grid, here shrunk on one
    axis and grown on the other."""

    def forward(self, tokens):
        size = (tokens.shape[2] // 2, tokens.shape[3] * 2 + 1)
        return torch.nn.functional.interpolate(tokens, size=size, mode="bicubic", antialias=True, align_corners=False)


class ClippedProjections(torch.nn.Module):
    """Gemma 4's audio attention: query, key and value each clamp the one input between bounds kept as buffers."""

    def __init__(self):
        super().__init__()
        self.projections = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.register_buffer("bounds", torch.tensor([[-1.0, 1.0], [-2.0, 0.5], [-0.5, 2.0]]))

    def forward(self, hidden_states):
        return tuple(projection(torch.clamp(hidden_states, low, high))
                     for projection, (low, high) in zip(self.projections, self.bounds))


class FeatureMapSizes(torch.nn.Module):
    """SAM 3: the encoder records its feature map's size in a tensor; the decoder reads it back to build a position
    bias over the map, which attention then checks against the keys."""

    def forward(self, features, queries):
        sizes = torch.tensor([tuple(features.shape[-2:])])
        height, width = sizes[0, 0], sizes[0, 1]
        bias = (torch.arange(height)[:, None] + torch.arange(width)).flatten().float()
        keys = features.flatten(2).transpose(1, 2)[:, None]
        return torch.nn.functional.scaled_dot_product_attention(queries, keys, keys, attn_mask=bias[None, None, None])


class PatchPositions(torch.nn.Module):
    """Idefics3's vision embeddings: fractional patch coordinates to position buckets."""

    def __init__(self):
        super().__init__()
        self.register_buffer("boundaries", torch.arange(1 / 4, 1.0, 1 / 4))

    def forward(self, coordinates):
        return torch.bucketize(coordinates, self.boundaries, right=True), torch.bucketize(coordinates, self.boundaries)


def built_by_the_sweep(name):
    """A class' tiny model, inputs and eager outputs as the sweep builds them."""
    from harness.cells import ClassContext
    from harness.models import select

    return ClassContext(select(name)[0]).prepare()


def exported_on_the_varying_axes(name, workarounds):
    """``name`` as the sweep builds it and its dynamic export on the axes the two input sets vary, with
    ``workarounds`` applied and the second set run like eager, that program, and ``export()``, which exports it again."""
    from harness.cells import varying_axes

    context = built_by_the_sweep(name)
    first, second = context.inputs["A"], context.inputs["B"]
    exporter, config = exporters.exporter_for("dynamo", dynamic=True, dynamic_shapes=varying_axes(first, second))
    exported = exporter.export(context.model, first, config)
    assert set(workarounds) <= set(exported.applied)
    assert_parity(exported(**second), context.expected["B"], TOLERANCE["dynamo"])
    return context, exported, lambda: exporter.export(context.model, first, config)


def fixed_axes_with_and_without(name, workarounds):
    """With each workaround disabled the export fixes some of the axes the sweep varies: which, per workaround."""
    from harness.cells import specialized_axes

    context, _, export = exported_on_the_varying_axes(name, workarounds)
    first, second = context.inputs["A"], context.inputs["B"]
    fixed = {}
    for workaround in workarounds:
        with disabled_workarounds(workaround):
            program = export()
        fixed[workaround] = specialized_axes(program.metadata["input_shapes"], first, second)
    return fixed


class RankedQueries(torch.nn.Module):
    """PP-DocLayout V2: queries sorted by whether they pass their class threshold, their boxes taken along."""

    def forward(self, queries):  # (batch, queries, score and box)
        scores, boxes = queries[..., 0], queries[..., 1:]
        order = torch.argsort((scores > 0).int(), dim=1, descending=True)
        return torch.take_along_dim(scores, order, dim=1), boxes.take_along_dim(order[..., None].expand(-1, -1, 4), 1)


class ByteGroupHashes(torch.nn.Module):
    """BLT's hashes of byte n-grams, by three of its primes."""

    def forward(self, token_ids):
        from transformers.models.blt import modeling_blt

        groups = ((3, 1000000007), (5, 5915587277), (8, 9576080509))
        return torch.stack([modeling_blt.byte_group_hash_function(token_ids, size, prime, 500) for size, prime in groups])


class PositionedPatches(torch.nn.Module):
    """A Qwen-VL-style tower: every patch gets its (row, column), computed at once from the image grid."""

    def forward(self, patches, grid_thw):
        from transformers.models.muse_spark.modeling_muse_spark import get_vision_position_ids

        from exporters.dynamo.patches.vision_patches import _patch_vision_positions_at_once

        positions = _patch_vision_positions_at_once(get_vision_position_ids)(grid_thw, 2)
        return patches + positions.to(patches.dtype).sum(-1, keepdim=True)


class TokensPastTheLastWindow(torch.nn.Module):
    """DeepSeek V4's compressor: windows of 4 tokens pooled, the tokens past the last one kept for the next call."""

    def forward(self, hidden):
        usable = hidden.shape[1] // 4 * 4
        return hidden[:, :usable].sum(1), hidden[:, usable:]


class NeighbourSums(torch.nn.Module):
    """Sums of neighbouring offsets through `unfold`, which `to_edge` decomposes into a slice of `count - 1`."""

    def forward(self, offsets):
        return offsets.unfold(0, 2, 1).sum(-1)


class KeptWhileRunning(torch.nn.Module):
    """LightGlue's keypoint mask: the pruned one for the pairs still running, the one they had for the others."""

    def forward(self, running, kept, live):
        return torch.where(running, kept, live)


class ChunkSolve(torch.nn.Module):
    def forward(self, system, values):
        return torch.linalg.solve_triangular(system, values, upper=False, unitriangular=True)


def row_updates(exported):
    """Steps of a row-by-row inverse: each writes one row of a chunk's triangular system."""
    return sum(node.target is torch.ops.aten.copy_.default for node in exported.program.graph.nodes)


CHUNK_SIZE = 64  # delta rule layers' default chunk, which they do not change


class TaskPrompts(torch.nn.Module):
    def __init__(self, language_backbone):
        super().__init__()
        self.language_backbone = language_backbone

    def forward(self, input_ids, attention_mask):
        return self.language_backbone(input_ids, mask=attention_mask, encode_type="task")


def global_tokens_in_one_sample(inputs):
    inputs["global_attention_mask"][:] = 0
    inputs["global_attention_mask"][1, :3] = 1


def visual_indicators_after_the_image(inputs):
    inputs["input_ids"][:, -6:-1] = torch.tensor([122, 123, 124, 125, 126])  # Ovis2's indicator ids, tiny


def a_whole_number_of_windows(inputs):  # which LED pads by a whole window, where eager pads nothing
    for name, value in inputs.items():
        inputs[name] = value[:, :4]


class CheckedTokens(torch.nn.Module):
    """A vision-language model's prefill checks its image-token mask with a tensor condition."""

    def forward(self, input_ids):
        torch._check_tensor_all(input_ids >= 0, lambda: "image tokens and features do not match")
        return input_ids.float() * 2


class SameEosCount(torch.nn.Module):
    """T5's classification head: every example must hold as many EOS tokens."""

    def forward(self, input_ids):
        torch._check(torch.unique_consecutive((input_ids == 1).sum(dim=1)).numel() == 1)
        return input_ids.float() * 2


class InvertedMask(torch.nn.Module):
    """XLNet's input mask: a number minus the integer attention mask."""

    def forward(self, attention_mask):
        return 1.0 - attention_mask


class TransposedAndItsCopy(torch.nn.Module):
    """RecurrentGemma's convolution output: transposed, and a contiguous copy of it taken as well."""

    def forward(self, x):
        transposed = (x * 2).transpose(1, 2)
        return transposed, transposed.contiguous()


class AttentionSinkMax(torch.nn.Module):
    """GPT-OSS's attention sinks: scores shifted by their maximum over the last axis, counted from the end."""

    def forward(self, scores):
        return scores - scores.max(dim=-1, keepdim=True).values


class TinyEpsilonNorm(torch.nn.Module):
    """A norm whose epsilon sits below the ONNX optimizer's tolerance for zero (Muse Spark's audio tower)."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)


class Softmaxed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, scores):
        return torch.softmax(self.inner(scores), dim=-1)


class StridePool(torch.nn.Module):
    """Hiera's pooling: the maximum over the stride axis of a 4-D view, that axis dropped."""

    def forward(self, tokens):
        return tokens.view(2, 4, -1, 8).max(dim=1).values


class PatchIndexPerImage(torch.nn.Module):
    """Inkling 2's vision tower: each image's patch index shifted by the image's number, repeated per patch."""

    def forward(self, patches, patches_per_image):
        image_ids = torch.arange(1, patches_per_image.shape[0] + 1)
        index = torch.arange(patches.shape[0]) + torch.repeat_interleave(image_ids, patches_per_image)
        return patches + index[:, None]


class OverflowClamped(torch.nn.Module):
    """BART's float16 encoder layer: its hidden states are clamped only when some value overflowed."""

    def forward(self, hidden):
        hidden = hidden * 2
        if hidden.dtype == torch.float16 and not torch.isfinite(hidden).all():
            clamp = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-clamp, max=clamp)
        return hidden + 1


class PickedColumns(torch.nn.Module):
    """Columns picked by a mask from the input (image-token positions): a data-dependent size in a middle axis."""

    def forward(self, x, keep):
        return x[:, keep] * 2


class ScoreAtFirstBest(torch.nn.Module):
    """ESMFold's pTM: the score at the coordinates of the first maximum, which `nonzero` finds."""

    def forward(self, scores):
        best = (scores == scores.max()).nonzero()[0]
        return scores[tuple(best)] * 2


class SilencedNoise(torch.nn.Module):
    """VITS's prior sampler with its noise scale at 0, and its duration predictor's noise of a given size."""

    def forward(self, means, log_variances):
        noise = torch.randn(means.shape[0], 1, means.shape[2]) * 0.0
        return means + torch.randn_like(means) * torch.exp(log_variances) * 0.0 + noise


class MaskedTail(torch.nn.Module):
    """VideoMAE's decoder: the last `masked` tokens, their count read from the mask."""

    def forward(self, tokens, masked):
        return tokens[:, -masked.nonzero().shape[0]:] * 2


class VideoConvolution(torch.nn.Module):
    """Emu3's video VQ-VAE: a 3-D convolution that pads and strides unlike its kernel (no patch embedding)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 6, kernel_size=3, stride=(1, 2, 2), padding=1)

    def forward(self, video):
        return self.conv(video)


class Tubelets(torch.nn.Module):
    """VideoMAE's and Qwen-VL's patch embedding: a 3-D convolution whose stride is its kernel."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))

    def forward(self, video):
        return self.proj(video)


class InterpolationTaps(torch.nn.Module):
    """Kimi-K2.5's position embedding: interpolation taps gathered and weighted as fixed-size bags."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, indices, weights):
        return torch.nn.functional.embedding_bag(indices, self.table, per_sample_weights=weights, mode="sum")


class NoiseRanks(torch.nn.Module):
    """ViTMAE's random masking argsorts its noise; SAM-HQ sorts its point scores."""

    def forward(self, noise):
        return torch.sort(noise, dim=1, descending=True).values + torch.argsort(noise, dim=1)


class SegmentMinimum(torch.nn.Module):
    """TAPAS: the smallest value in each segment of the table (segment 3 has none and keeps its zero)."""

    def forward(self, values, segments):
        return torch.zeros(5).scatter_reduce(0, segments, values, "amin", include_self=False)


class SegmentMeans(torch.nn.Module):
    """TAPAS: each segment's mean, with the value it had (segment 3 has no cell and keeps its one)."""

    def forward(self, values, segments):
        return torch.ones(5).scatter_reduce(0, segments, values, "mean", include_self=True)


class PatchMaxima(torch.nn.Module):
    """BLT: each patch's states, the largest over its bytes' (patch 2 has none and keeps its zero)."""

    def forward(self, states, patches):
        index = patches.unsqueeze(-1).expand(-1, -1, states.shape[-1])
        return torch.zeros(states.shape[0], 4, states.shape[-1]).scatter_reduce(1, index, states, "amax",
                                                                                 include_self=False)


class TimeShift(torch.nn.Module):
    """RWKV: every step sees the previous one, padded in front and cropped at the end."""

    def __init__(self):
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, hidden_states):
        return self.shift(hidden_states) + hidden_states


class LevelOrder(torch.nn.Module):
    """Positions ordered by a small integer level, many of them equal."""

    def forward(self, levels):
        ordered = torch.sort(levels, dim=-1)
        return ordered.values, ordered.indices


class CroppedUpscale(torch.nn.Module):
    """Swin2SR's upsampler: tokens laid out as an image (channels last), upscaled by a pixel shuffle, cropped."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 12, 3, padding=1)
        self.last = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, tokens):  # (batch, height, width, channels)
        image = self.last(torch.nn.functional.pixel_shuffle(self.conv(tokens.permute(0, 3, 1, 2)), 2)) + 0.5
        return image[:, :, : tokens.shape[1] * 2 - 1, : tokens.shape[2] * 2]


class VisibleTokenAttention(torch.nn.Module):
    """VideoMAE pre-training: each sample's visible tokens (as many per sample), picked by the mask, attend to each
    other."""

    def forward(self, tokens, masked):
        visible = tokens[~masked].reshape(tokens.shape[0], -1, tokens.shape[2])
        return visible @ visible.transpose(1, 2)


def planned_bytes(exported) -> int:
    from exporters.executorch.runtime import execution_plan

    return sum(execution_plan(exported.program).non_const_buffer_sizes)


class KeySample(torch.nn.Module):
    """Informer's ProbSparse attention measures its queries against keys drawn at random."""

    def forward(self, keys):
        return torch.randint(0, keys.shape[1], (400,)), torch.randint(3, size=(2, 5))


class CircularTokenConvolution(torch.nn.Module):
    """Informer embeds its time series by a convolution that pads circularly."""

    def __init__(self):
        super().__init__()
        self.convolution = torch.nn.Conv1d(3, 4, kernel_size=3, padding=1, padding_mode="circular")

    def forward(self, series):
        return self.convolution(series.transpose(1, 2))


class SelectedCounts(torch.nn.Module):
    """GLM-5 Next: how often each key was selected, counted by an int32 index."""

    def forward(self, selected):
        counts = torch.zeros(selected.shape[0], 6, dtype=torch.int32)
        return counts.scatter_add_(-1, selected.to(torch.int32), torch.ones_like(selected, dtype=torch.int32))


class SqueezedProjection(torch.nn.Module):
    """Mistral 3's projector: squeezes a leading axis that, for several images, is not one."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        return self.projection(tokens).squeeze(0)


class TransducerJoint(torch.nn.Module):
    """Parakeet's joint network: every audio frame against every label, then a squeeze that leaves labels alone."""

    def forward(self, frames, labels):
        return (frames[:, :, None] + labels[:, None]).squeeze(2)


class PatchEntropy(torch.nn.Module):
    """BLT's patcher: the entropy of each position's next-byte distribution decides where patches start."""

    def forward(self, logits):
        # validating, as by default: dynamo switches the default off for the process once it has compiled anything
        # (the scan operator the recurrence patches use compiles its step), which would let the test pass unpatched
        return torch.distributions.Categorical(logits=logits, validate_args=True).entropy()


class SpecialTokenSpans(torch.nn.Module):
    """Grounding DINO: each token's previous special token by a running maximum, its next one by a running
    minimum."""

    def forward(self, positions):
        return (*torch.cummax(positions, dim=1), *torch.cummin(positions.flip(1), dim=1))


class RowsOfSamples(torch.nn.Module):
    """Music Flamingo: the audio sample each encoder row comes from, searching float row starts among integer
    sample ends."""

    def forward(self, sample_lengths, row_starts):
        return torch.searchsorted(sample_lengths.cumsum(0), row_starts, right=True)


class ShuffledRows(torch.nn.Module):
    """PatchTST's forecast masking shuffles its batch rows; sorted, a permutation is every row once."""

    def forward(self, rows):
        return torch.randperm(rows.shape[0]).sort().values


class TokenPReLU(torch.nn.Module):
    """DAB-DETR's encoder: a PReLU on 3-D tokens (here one slope per channel, on axis 1)."""

    def __init__(self):
        super().__init__()
        self.activation = torch.nn.PReLU(num_parameters=5, init=0.1)

    def forward(self, tokens):
        return self.activation(tokens)


class UnbatchedNonMaximumSuppression(torch.nn.Module):
    """SuperPoint's non-maximum suppression: a max pool of its (images, height, width) score maps."""

    def forward(self, scores):
        return torch.nn.functional.max_pool2d(scores, kernel_size=3, stride=1, padding=1) == scores


class EvalModeDropout(torch.nn.Module):
    """SpeechT5's decoder prenet draws its dropout mask in eval mode too, here with a probability of 0."""

    def forward(self, embeddings):
        return torch.where(torch.bernoulli(embeddings, p=0.0) == 1, embeddings, 0) + embeddings


class ModalityMasks(torch.nn.Module):
    """Perceiver's multimodal preprocessor: each modality's samples masked with its own probability (0 or 1)."""

    def forward(self, audio, label):
        never = torch.bernoulli(torch.full(audio.shape[:2], 0.0))
        always = torch.bernoulli(torch.full(label.shape[:2], 1.0))
        return audio * (1 - never[..., None]), label * (1 - always[..., None])


class MainAndPredictedStreams(torch.nn.Module):
    """ProphetNet's decoder cuts its hidden states into the main and the predicting streams, halves of a length."""

    def forward(self, hidden):
        main, predicted = hidden.chunk(2, dim=1)
        return main * 2 + predicted


class TanhGelu(torch.nn.Module):
    """Gemma's and SigLIP's MLPs: `gelu_pytorch_tanh`."""

    def forward(self, x):
        return torch.nn.functional.gelu(x, approximate="tanh")


def crossed_chains():
    """Two chains, each a delegated node, a portable one and a delegated one; partitions that each take the start
    of one chain and the end of the other are each convex, and feed one another in a ring."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    first_start = graph.call_function(torch.relu, (x,))
    first_end = graph.call_function(torch.relu, (graph.call_function(torch.neg, (first_start,)),))
    second_start = graph.call_function(torch.sigmoid, (x,))
    second_end = graph.call_function(torch.sigmoid, (graph.call_function(torch.neg, (second_start,)),))
    graph.output((first_end, second_end))
    return torch.fx.GraphModule(torch.nn.Module(), graph), [[first_start, second_end], [second_start, first_end]]


class BucketsModuloLength(torch.nn.Module):
    """Reformer's LSH attention takes its sorted positions modulo the (padded) sequence length."""

    def forward(self, positions):
        return positions % positions.shape[1]


class PositiveEntries(torch.nn.Module):
    """A mask's true places, the way vision towers pick their real patches: `nonzero` of a vector, its column
    taken with `squeeze`, and the same through `torch.where(mask)` (whose tuple `to_edge` decomposes)."""

    def forward(self, scores):
        flat = scores.flatten()
        index = (flat > 0).nonzero().squeeze(1)
        where = torch.where(flat < 0)[0]
        torch._check(index.shape[0] > 1)
        torch._check(where.shape[0] > 1)
        return flat[index] * 2, flat[where]


class KeypointsAboveThreshold(torch.nn.Module):
    """SuperPoint's keypoints: where the scores pass a threshold, as (x, y), and the scores there."""

    def forward(self, scores):
        places = (scores > 0.5).nonzero()
        return places.flip(1).float(), scores[places[:, 0], places[:, 1]]


class SpaceToDepth(torch.nn.Module):
    """Perceiver's video patches: frames folded into blocks of 2 x 2 x 2 through an 8-axis view and permute."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(24, 8)

    def forward(self, frames):
        batch, time, channels, height, width = frames.shape
        blocks = frames.view(batch, time // 2, 2, channels, height // 2, 2, width // 2, 2)
        blocks = blocks.permute(0, 1, 4, 6, 2, 5, 7, 3).reshape(batch, time // 2, height // 2, width // 2, -1)
        return self.projection(blocks * 2)


class EmptyKeysConcatenated(torch.nn.Module):
    """A key cache of zero width (MistralLarge 4's rope-less part) concatenated with the step's empty keys."""

    def forward(self, states):
        empty = states[..., :0]
        keys = torch.cat([empty, empty * 2], dim=-1)
        return states * 2, keys


class WindowOrdered(torch.nn.Module):
    """MiniCPM-V's window merger: patches put in window order by the index its image sizes give, then read image by
    image."""

    def forward(self, hidden_states, target_sizes):
        from transformers.models.minicpmv4_7 import modeling_minicpmv4_7 as minicpm

        grid = torch.nn.functional.pad(target_sizes, (1, 0), value=1)
        window_index, _ = minicpm.get_vision_window_index(grid, 1, 2, 1)
        ordered = hidden_states[:, window_index] * 2
        first = int(target_sizes[0].prod())
        return ordered[:, :first], ordered[:, first:]


class EmptyCacheExtended(torch.nn.Module):
    """A value cache that starts as a 1-D tensor of no elements, extended by a step's values of zero width
    (MistralLarge 4's layers without rope)."""

    def forward(self, states):
        values = states[..., :0].unsqueeze(1)
        return states * 2, torch.cat([torch.tensor([]), values], dim=-2)


class EmptyCacheGrown(torch.nn.Module):
    """A decode step's value cache of zero width (MistralLarge 4's layers without rope) grown by the step's values."""

    def forward(self, past, states):
        return states * 2, torch.cat([past, states[..., :0].unsqueeze(1)], dim=-2)


class KeypointPlaces(torch.nn.Module):
    """EfficientLoFTR's coarse keypoints: a matched index (-1 when unmatched) split into column and row, by a
    width that is a tensor, a constant, a negative divisor and a size (symbolic when exported dynamic)."""

    def forward(self, matched):
        width = torch.tensor(4)
        return torch.stack([matched % width, matched // width, matched % 4, matched % -3, matched % (width - 7),
                            matched % (matched.shape[-1] // 2)])


class PaddedToBlocks(torch.nn.Module):
    """LongT5's local attention: tokens padded to whole blocks of 4 by `-length % 4`, then summed block by block."""

    def forward(self, tokens):
        padded = torch.nn.functional.pad(tokens, (0, 0, 0, -tokens.shape[1] % 4))
        return padded.view(tokens.shape[0], -1, 4, tokens.shape[2]).sum(2)


class EntropyPatchStarts(torch.nn.Module):
    """BLT's patcher: the positions of the peaks of each row first (then the other positions), cut at the largest
    count of peaks, a number read from the data and compared with the width of a dynamic axis."""

    def forward(self, scores):
        peaks = scores > 0
        width = peaks.shape[1]
        positions = torch.arange(width).expand(scores.shape[0], -1)
        starts = torch.cat([positions, torch.full_like(positions, width)], 1)[torch.cat([peaks, ~peaks], 1)]
        return starts.reshape(scores.shape[0], width)[:, : peaks.sum(1).max()]


class RelativeShift(torch.nn.Module):
    """XLNet's relative shift: scores against twice as many relative positions, shifted by one through a reshape,
    whose sizes interval arithmetic bounds far above their largest values."""

    def forward(self, scores):
        batch, length = scores.shape
        table = scores[:, :, None] * torch.arange(2 * length, dtype=scores.dtype)
        shifted = table.reshape(batch, 2 * length, length)[:, 1:].reshape(batch, length, 2 * length - 1)
        return torch.index_select(shifted, 2, torch.arange(length))


class GuardedProjection(torch.nn.Module):
    """A branch on the sequence length (a guard on a symbolic size) around a linear layer XNNPACK takes."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(4, 4)

    def forward(self, tokens):
        if tokens.shape[1] > 2:
            tokens = tokens * 2
        return self.projection(tokens)


# several resolutions to pick from, and images that pick each: wide and tall ones lose rows or columns unpadded
ANYRES_PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [64, 128], [128, 64]]


ANYRES_SIZES = torch.tensor([[10, 60], [60, 10], [32, 32], [50, 45], [64, 40], [10, 120], [120, 10]])


def anyres_features(output):
    """Every image's features end to end: LLaVA-NeXT's per-image list, or each of Granite 4 Vision's layers'."""
    if hasattr(output, "deepstack_features"):
        return [torch.cat(parts) for _, parts in output.deepstack_features]
    return [torch.cat(output.pooler_output)]


class AudioFeatures(torch.nn.Module):
    """A thinker's audio path alone: its features for frames and their mask."""

    def __init__(self, thinker):
        super().__init__()
        self.thinker = thinker

    def forward(self, input_features, feature_attention_mask):
        return self.thinker.get_audio_features(input_features, feature_attention_mask).last_hidden_state


class RecastTable(torch.nn.Module):
    """CTRL: a position table reassigned in the forward, cast to the dtype it already has; the trace records an
    update of the buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(1.0, 13.0).reshape(6, 2), persistent=False)

    def forward(self, positions):
        self.table = self.table.to(dtype=torch.float32)
        return self.table[positions]


# The with-and-without checks the test files share: each file lists its cases, these run them.


def check_class_case(name, backend, workaround, error):
    """The sweep's tiny ``name`` exports on ``backend`` with ``workaround`` and matches eager; without it, fails."""
    context = built_by_the_sweep(name)
    assert context.ok, context.stages[-1].message
    exported = export_tiny(context, backend)
    assert workaround in exported.applied
    assert_parity(exported(**context.inputs["A"]), context.expected["A"], TOLERANCE[backend])
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        export_tiny(context, backend)


def check_dynamic_cell_case(name, backend, failures):
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


def check_pattern_case(backend, module, inputs, workaround, error):
    """A small module of one pattern exports with ``workaround``, equal to eager; without it, fails with ``error``."""
    model = module().eval()
    exporter, config = exporters.exporter_for(backend)
    exported = exporter.export(model, inputs, config)
    assert workaround in exported.applied
    expected = model(**inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(exported(**inputs).values(), expected, strict=True):
        assert torch.equal(got, want)
    with disabled_workarounds(workaround), pytest.raises(exporters.ExportError, match=error):
        exporter.export(model, inputs, config)


def check_axes_stay_dynamic(name, workaround, input_name):
    """With ``workaround`` the dynamic program runs the second input set; without it ``input_name`` is fixed."""
    context = built_by_the_sweep(name)
    second = context.inputs["B"]
    assert second[input_name].shape != context.inputs["A"][input_name].shape
    exported = export_tiny(context, "dynamo", dynamic=True)
    assert_parity(exported(**second), context.expected["B"], TOLERANCE["dynamo"])
    with disabled_workarounds(workaround):
        batch_fixed = export_tiny(context, "dynamo", dynamic=True)
    with pytest.raises(Exception, match=input_name):
        batch_fixed(**second)


def check_runtime_case(module, inputs, workaround, error):
    """A pattern that exports either way, but that the ExecuTorch runtime runs only rewritten by ``workaround``."""
    model = module().eval()
    exporter, config = exporters.exporter_for("executorch")
    exported = exporter.export(model, inputs, config)
    assert workaround in exported.applied
    (got,) = exported(**inputs).values()
    torch.testing.assert_close(got, model(**inputs), atol=1e-5, rtol=1e-5)
    with disabled_workarounds(workaround):
        as_traced = exporter.export(model, inputs, config)
    with pytest.raises(RuntimeError, match=error):
        as_traced(**inputs)
