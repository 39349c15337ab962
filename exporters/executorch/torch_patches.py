"""ExecuTorch stage 2, torch patches: torch ops the ExecuTorch backends cannot take as the model calls them,
replaced while the model is traced.
"""

from __future__ import annotations

import math

import torch

from ..registration import register_patch, report_applied
from ..rewrites import resize_weights, running_extremes_by_comparison


# ── Stage 2: Torch patches ───────────────────────────────────────────────────
# `@register_patch("executorch", "torch.<op>")`: ops the ExecuTorch backends cannot take as the model calls them.


# the runtime has no running maximum or minimum either (Grounding DINO's special-token spans)
@register_patch(
    "executorch", "torch.cummax", "torch.cummin",
    model_side="upstream change: ExecuTorch should accept aten.cummax/aten.cummin (not Core ATen, no portable "
               "kernel) \u2014 either via a core-ATen decomposition in torch or a portable kernel plus an "
               "edge-dialect exception.",
)
def _patch_running_extremes_by_comparison(original):
    """The runtime has no kernel for `cummax` or `cummin` (Grounding DINO's special-token spans): computed from
    comparisons, as for ONNX (`exporters/rewrites.py`)."""
    return running_extremes_by_comparison(original)


@register_patch(
    "executorch", "torch.nn.functional.conv3d", reports=True,
    upstream="https://github.com/pytorch/executorch/issues/11704",
)
def _patch_conv3d_as_frames_of_conv2d(original):
    """The portable convolution takes 3-D and 4-D inputs only ("Expect input tensor to be 3-D or 4-D, but got, 5";
    Emu3's video VQ-VAE). A 3-D convolution is the sum over the kernel's frames of 2-D convolutions, each of the
    input frames that kernel frame meets. Patch embeddings (stride = kernel) of a video whose sizes are known stay
    for `_fix_patchify_conv3d`, which folds them into one linear layer."""

    def triple(value):
        return tuple(value) * (3 if len(value) == 1 else 1) if isinstance(value, (tuple, list)) else (value,) * 3

    def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        kernel, stride, dilation = tuple(weight.shape[2:]), triple(stride), triple(dilation)
        if isinstance(padding, str) or input.dim() != 5:
            return original(input, weight, bias, stride, padding, dilation, groups)
        padding = triple(padding)
        patchify = stride == kernel and padding == (0, 0, 0) and dilation == (1, 1, 1)
        if patchify and all(isinstance(size, int) for size in input.shape[2:]):
            return original(input, weight, bias, stride, padding, dilation, groups)
        report_applied()
        if padding[0]:
            input = torch.nn.functional.pad(input, (0, 0, 0, 0, padding[0], padding[0]))
        batch, channels, depth = input.shape[:3]
        frames_out = (depth - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
        total = None
        for index in range(kernel[0]):
            start = index * dilation[0]
            frames = input[:, :, start:start + (frames_out - 1) * stride[0] + 1:stride[0]]
            frames = frames.transpose(1, 2).reshape(-1, channels, *input.shape[3:])
            step = torch.nn.functional.conv2d(frames, weight[:, :, index], None, stride[1:], padding[1:],
                                              dilation[1:], groups)
            total = step if total is None else total + step
        if bias is not None:
            total = total + bias.view(-1, 1, 1)
        return total.reshape(batch, frames_out, *total.shape[1:]).transpose(1, 2)

    return conv3d


@register_patch(
    "executorch", "torch.bucketize",
    upstream="https://github.com/pytorch/executorch/issues/20270",
)
def _patch_bucketize_as_comparison(original):
    """`bucketize` is not in the Core ATen opset the edge dialect checks, and the portable runtime has no kernel
    for it (https://github.com/pytorch/executorch/issues/20270; Idefics3's patch positions). A bucket index is
    the number of boundaries below the value (at or below it with `right=True`): a comparison and a sum."""

    def bucketize(input, boundaries, *, out_int32=False, right=False, **kwargs):
        if kwargs or not isinstance(input, torch.Tensor):
            return original(input, boundaries, out_int32=out_int32, right=right, **kwargs)
        return _insertion_points(boundaries, input, right, out_int32)

    return bucketize


@register_patch(
    "executorch", "torch.searchsorted",
    upstream="https://github.com/pytorch/pytorch/issues/151793",
)
def _patch_searchsorted_as_comparison(original):
    """`searchsorted` is not in the Core ATen opset either (Music Flamingo maps its encoder rows to their audio
    samples by it): the same count as `bucketize`'s, per sorted row."""

    def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None, **kwargs):
        if kwargs or sorter is not None or not isinstance(values, torch.Tensor):
            return original(sorted_sequence, values, out_int32=out_int32, right=right, side=side, sorter=sorter,
                            **kwargs)
        return _insertion_points(sorted_sequence, values, right or side == "right", out_int32)

    return searchsorted


def _insertion_points(sorted_rows, values, right, out_int32):
    """Where each value goes in its sorted row (a 1-D row, or rows with the values' leading sizes): how many of the
    row's elements lie below it, or at or below it on the right."""
    rows = sorted_rows if sorted_rows.dim() == 1 else sorted_rows.unsqueeze(-2)
    expanded = values.unsqueeze(-1)
    below = rows <= expanded if right else rows < expanded
    return below.sum(dim=-1, dtype=torch.int32 if out_int32 else torch.int64)


@register_patch(
    "executorch", "torch.repeat_interleave", "torch.Tensor.repeat_interleave",
    model_side="upstream change: torch/ExecuTorch should let repeat_interleave with a tensor of counts "
               "(aten.repeat_interleave.Tensor, dynamic_output_shape, not Core ATen) pass to_edge \u2014 ExecuTorch "
               "already has a repeat_interleave.Tensor_out portable kernel \u2014 and to_edge's re-trace should not "
               "fail on the symbolic output size ('Cannot cast FakeTensor ... to number').",
)
def _patch_repeat_interleave_as_gather(original):
    """`repeat_interleave` with a tensor of counts (vision towers' per-image boundaries and indices, computed from
    the image grid) is not in the Core ATen opset. Output position p takes the element whose running count first
    exceeds p: a comparison, a sum and a gather. The total is read from a sum, not the last running count: `.item()`
    of a view at a symbolic offset fails `to_edge`'s re-trace ("Cannot cast FakeTensor ... to number")."""

    def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
        if repeats is None and isinstance(input, torch.Tensor) and input.dim() == 1:  # the counts alone
            input, repeats = torch.arange(input.shape[0], device=input.device), input
        if not isinstance(repeats, torch.Tensor) or repeats.dim() != 1 or repeats.shape[0] == 1:
            return original(input, repeats, dim, output_size=output_size)
        if dim is None:
            input, dim = input.flatten(), 0
        ends = repeats.cumsum(0)
        total = output_size if output_size is not None else repeats.sum().item()
        torch._check(total >= 0)
        positions = torch.arange(total, device=repeats.device)
        return input.index_select(dim, (positions[:, None] >= ends[None, :]).sum(dim=-1))

    return repeat_interleave


@register_patch(
    "executorch", "torch.randint",
    model_side="upstream change: torch's Core ATen decompositions (or ExecuTorch's edge passes) should lower "
               "aten.randint/randint.low to the core aten.rand ops ExecuTorch has kernels for.",
)
def _patch_randint_as_scaled_rand(original):
    """`randint` is not in the Core ATen opset; `rand` is, and the runtime has its kernel. The same uniform
    integers in [low, high) as floor(rand * (high - low)) + low, drawn in float64 so every range below 2**53 is
    exact (Informer samples the keys its ProbSparse attention measures)."""

    def randint(*args, **kwargs):
        bounds, size = (args, kwargs["size"]) if "size" in kwargs else (args[:-1], args[-1])
        if kwargs.get("generator") is not None or "out" in kwargs or len(bounds) not in (1, 2):
            return original(*args, **kwargs)
        low, high = (0, *bounds) if len(bounds) == 1 else bounds
        options = {key: value for key, value in kwargs.items() if key not in ("size", "generator", "dtype")}
        uniform = torch.rand(size, dtype=torch.float64, **options)
        return (uniform * (high - low)).floor().to(kwargs.get("dtype") or torch.int64) + low

    return randint


@register_patch(
    "executorch", "torch.nn.functional.interpolate", reports=True,
    model_side="upstream change: ExecuTorch should accept and implement aten._upsample_bicubic2d_aa (portable "
               "kernel plus edge-dialect allowance), as it already does for _upsample_bilinear2d_aa.",
)
def _patch_antialiased_resize_as_matmuls(original):
    """The antialiased bicubic resize (`_upsample_bicubic2d_aa`) is not in the Core ATen opset, and ExecuTorch has
    no kernel for it (it has the bilinear one); UnlimitedOCR's tower resizes its position grid so. The resize is
    separable: each axis' weights, computed from the sizes, applied as a matrix product, the columns first as torch
    does."""

    def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                    recompute_scale_factor=None, antialias=False):
        if (not antialias or mode != "bicubic" or input.dim() != 4 or size is None
                or scale_factor is not None or align_corners):
            return original(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
        report_applied()
        rows, columns = (size, size) if isinstance(size, int) else size

        def weights(count, source):
            positions = torch.arange(count, device=input.device)
            return resize_weights(torch.full_like(positions, count), positions, source, True, mode)

        resized = input.float() @ weights(columns, input.shape[-1]).T
        return (weights(rows, input.shape[-2]) @ resized).to(input.dtype)

    return interpolate


@register_patch(
    "executorch", "torch.nn.functional.embedding_bag",
    model_side="upstream change: ExecuTorch's portable kernel library should implement the Core ATen op "
               "aten._embedding_bag.",
)
def _patch_embedding_bag_as_gather(original):
    """The portable runtime has no `_embedding_bag` kernel (Kimi-K2.5's position embedding gathers interpolation
    taps with it). Fixed-size bags (a 2-D input) are a gather and a weighted sum or mean over the bag axis."""

    def embedding_bag(input, weight, offsets=None, *args, per_sample_weights=None, mode="mean", **kwargs):
        if args or kwargs or offsets is not None or input.dim() != 2 or mode not in ("sum", "mean"):
            return original(input, weight, offsets, *args, per_sample_weights=per_sample_weights, mode=mode, **kwargs)
        rows = torch.nn.functional.embedding(input, weight)
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.unsqueeze(-1)
        return rows.sum(dim=1) if mode == "sum" else rows.mean(dim=1)

    return embedding_bag


@register_patch(
    "executorch", "torch.scatter_reduce", "torch.Tensor.scatter_reduce",
    upstream="https://github.com/pytorch/executorch/issues/11330",
)
def _patch_scatter_reduce_as_dense(original):
    """The portable runtime has no `scatter_reduce` kernel (TAPAS reduces its table cells per segment with it, BLT
    its bytes' states per patch), but it has `scatter_add`, `gather` and `scatter`. A sum or a mean is two
    `scatter_add`s (the totals, the counts). A largest or smallest value compares every source with every other
    along the scattered axis: each source gets the extreme of the sources sharing its slot, and a `scatter` writes
    it there (sources of one slot write the same value); slots no source reaches keep their value. Comparing sources
    with slots instead planned TAPAS' 65,536 segments per table by its tokens: 8 GB for a dynamic batch. Indices as
    wide as the output on the other axes only."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    reductions = ("sum", "mean", "amax", "amin")

    def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
        dim %= max(input.dim(), 1)
        if (not input.is_floating_point() or reduce not in reductions or index.dim() != input.dim()
                or not all(statically_known_true(index.shape[axis] == input.shape[axis])
                           for axis in range(input.dim()) if axis != dim)):  # fmt: skip
            return original(input, dim, index, src, reduce, include_self=include_self)
        sources = src[tuple(slice(0, size) for size in index.shape)].to(input.dtype)
        if reduce in ("sum", "mean"):
            total = torch.zeros_like(input).scatter_add(dim, index, sources)
            count = torch.zeros_like(input).scatter_add(dim, index, torch.ones_like(sources))
            if reduce == "sum":
                return input + total if include_self else torch.where(count > 0, total, input)
            if include_self:
                return (input + total) / (count + 1)
            return torch.where(count > 0, total / count.clamp(min=1), input)
        highest = reduce == "amax"
        fill = torch.finfo(input.dtype).min if highest else torch.finfo(input.dtype).max
        same_slot = index.unsqueeze(dim + 1) == index.unsqueeze(dim)  # (..., source, other source, ...)
        extreme = torch.where(same_slot, sources.unsqueeze(dim), fill)
        extreme = extreme.amax(dim=dim + 1) if highest else extreme.amin(dim=dim + 1)
        if include_self:
            kept = input.gather(dim, index)
            extreme = torch.maximum(extreme, kept) if highest else torch.minimum(extreme, kept)
        return input.scatter(dim, index, extreme)

    return scatter_reduce


def _dft_angles(frequencies, size, like):
    """The angles of a ``size``-point DFT matrix's first ``frequencies`` rows, in ``like``'s dtype."""
    rows, columns = torch.arange(frequencies, device=like.device), torch.arange(size, device=like.device)
    return (rows[:, None] * columns[None, :] % size).to(like.dtype) * (2 * math.pi / size)  # exact turns first


@register_patch(
    "executorch", "transformers.models.fnet.modeling_fnet.FNetBasicFourierTransform.forward",
    model_side="FNetBasicFourierTransform should compute the real part of its 2-D DFT with real cosine/sine "
               "matrix products (C\u00b7X\u00b7C\u1d40 \u2212 S\u00b7X\u00b7S\u1d40) instead of torch.fft.fftn(...).real (or its complex64 "
               "DFT-matrix path), so no complex tensor or _fft_c2c is traced.",
)
def _patch_fnet_fourier_as_matmul(original):
    """FNet mixes tokens with the real part of a 2-D FFT over sequence and hidden axes; complex FFTs are not in the
    Core ATen opset (`_fft_c2c`). For a real input that real part is C X C' - S X S', with C and S the cosines and
    sines of the two axes' DFT matrices: four matrix products."""

    def dft_basis(size, like):
        angle = _dft_angles(size, size, like)
        return angle.cos(), angle.sin()

    def forward(self, hidden_states):
        if hidden_states.dim() != 3 or hasattr(self, "dft_mat_seq"):  # its TPU variant truncates fixed DFT matrices
            return original(self, hidden_states)
        cos_tokens, sin_tokens = dft_basis(hidden_states.shape[1], hidden_states)
        cos_hidden, sin_hidden = dft_basis(hidden_states.shape[2], hidden_states)
        mixed = cos_tokens @ hidden_states @ cos_hidden - sin_tokens @ hidden_states @ sin_hidden
        return (mixed,)

    return forward


def _inverse_real_dft_basis(size, like):
    """The inverse real FFT of ``size`` points as two matrices: frames = real @ cosines - imaginary @ sines, for a
    one-sided spectrum of ``size // 2 + 1`` bins. Bins between DC and Nyquist stand for their conjugate too (twice);
    the sines of DC and Nyquist vanish, so their imaginary parts are ignored, as `irfft` ignores them."""
    angle = _dft_angles(size // 2 + 1, size, like)
    twice = torch.ones(size // 2 + 1, dtype=like.dtype, device=like.device)
    twice[1 : (size + 1) // 2] = 2  # an even size's last bin is Nyquist: once
    return angle.cos() * twice[:, None] / size, angle.sin() * twice[:, None] / size


@register_patch(
    "executorch",
    "transformers.models.neucodec.modeling_neucodec.NeuCodecISTFTHead.forward",
    "transformers.models.xcodec2.modeling_xcodec2.Xcodec2ISTFTHead.forward",
    model_side="NeuCodecISTFTHead and Xcodec2ISTFTHead should build the inverse-FFT frames from "
               "magnitude\u00b7cos/sin(phase) with real matrix products (and overlap-add by a real op) instead of "
               "torch.polar + torch.fft.irfft on a complex spectrum.",
)
def _patch_vocos_istft_as_real_products(_original):
    """NeuCodec's and X-Codec 2's heads (Vocos') make a complex spectrum of magnitude and phase (`torch.polar`),
    turn it into frames by an inverse real FFT and overlap-add those: no complex op is in the Core ATen opset.
    The same frames are two matrix products of the spectrum's real and imaginary parts; the overlap-add is a
    transposed convolution by the identity at a stride of the hop, which adds each frame in at its offset."""

    def overlap_added(frames, hop):  # (batch, n_fft, frames) -> (batch, (frames - 1) * hop + n_fft)
        offsets = torch.arange(frames.shape[1], device=frames.device)  # not `eye`: to_edge makes its positions uint16
        identity = (offsets[:, None] == offsets[None, :]).to(frames.dtype)[:, None, :]
        return torch.nn.functional.conv_transpose1d(frames, identity, stride=hop)[:, 0]

    def forward(self, hidden_states):
        magnitude, phase = self.linear(hidden_states).float().chunk(2, dim=-1)
        magnitude = magnitude.exp().clamp(max=1e2)
        cosines, sines = _inverse_real_dft_basis(self.n_fft, magnitude)
        frames = (magnitude * phase.cos()) @ cosines - (magnitude * phase.sin()) @ sines
        audio = overlap_added((frames * self.window).transpose(1, 2), self.hop_length)
        window_envelope = overlap_added(self.window.square()[None, :, None].expand(1, -1, frames.shape[1]), self.hop_length)
        trim = slice(self.padding, -self.padding)
        return (audio[:, trim] / window_envelope[0, trim].clamp(min=1e-11)).unsqueeze(1)

    return forward
