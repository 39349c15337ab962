"""ExecutorchExporter: a transformers model to an ExecuTorch ``.pte`` program run by the ExecuTorch runtime.

Around ``to_edge_transform_and_lower`` and ``to_executorch``, in five stages:

1. backend preparation: ``prepare_for_<name>`` (``_BACKEND_PREPARE``) puts the model on the backend's device and
   dtype and returns its partitioners;
2. torch patches: ``@register_patch("executorch", "torch....")``, active while the model is traced;
3. ExecuTorch patches: ``@register_patch("executorch", "executorch....")``, active while it is lowered;
4. FX program fixes: ``@register_fx_program_fix("executorch")``, when the fix needs the whole program;
5. FX node fixes: ``@register_fx_node_fix("executorch")``, one node at a time.

ExecuTorch is imported on first use: it costs seconds, and the other backends do not need it.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import operator
import sys
import types
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from .exported import Exported, build_metadata
from .exporter_dynamo import DynamoConfig, _patch_contiguity_asked_without_guards, _resize_weights, trace_model
from .exporter_onnx import _patch_running_extremes_by_comparison
from .utils import (
    EXECUTORCH_BACKENDS,
    ExecutorchExportError,
    StageLog,
    applied_reporter,
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    contiguous_copy,
    is_backend_internal,
    register_executorch_backend,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
    report_applied,
    without_autograd_for_scans,
)

_BACKEND_PREPARE = EXECUTORCH_BACKENDS


@dataclass
class ExecutorchConfig(DynamoConfig):
    backend: str = "xnnpack"


class ExecutorchExported(Exported):
    backend = "executorch"
    program_file = "model.pte"

    def __init__(self, program: bytes, metadata):
        super().__init__(program, metadata)
        self._method = None

    def _runtime(self):
        if self._method is None:
            from executorch.runtime import Runtime

            try:
                self._method = Runtime.get().load_program(self.program).load_method("forward")
            except RuntimeError as error:
                missing = _operators_without_kernels(self.program)
                if missing:
                    raise RuntimeError(f"the ExecuTorch runtime has no kernel for {', '.join(missing)}") from error
                raise
        return self._method

    method = property(_runtime)

    def _run(self, feed):
        outputs = list(self.method.execute(feed))
        # inputs the program updates in place (a static cache) come back first: the user outputs follow them
        return outputs[self.metadata.get("mutated_inputs", 0) :]

    def _save_program(self, path: Path) -> None:
        path.write_bytes(self.program)

    @classmethod
    def _load(cls, directory, metadata):
        return cls((directory / cls.program_file).read_bytes(), metadata)


class ExecutorchExporter:
    """``ExecutorchExporter().export(model, inputs, ExecutorchConfig())`` -> a callable ``ExecutorchExported``."""

    def export(self, model: torch.nn.Module, inputs: dict, config: ExecutorchConfig | None = None) -> ExecutorchExported:
        config = config or ExecutorchConfig()
        log = StageLog(ExecutorchExportError)
        fired: set[str] = set()
        try:
            with log.stage("backend-preparation"):
                if config.backend not in _BACKEND_PREPARE:
                    raise ValueError(
                        f"unknown ExecuTorch backend {config.backend!r}: expected one of {', '.join(_BACKEND_PREPARE)}"
                    )
                partitioners = _BACKEND_PREPARE[config.backend](model)
            with ExitStack() as active:
                with log.stage("torch-patches"):
                    active.enter_context(
                        apply_patches("executorch", fired, select=lambda path: not is_backend_internal(path))
                    )
                traced = trace_model(model, inputs, config, log)
            with ExitStack() as active:
                active.enter_context(without_autograd_for_scans(traced.program))
                with log.stage("executorch-patches"):
                    active.enter_context(apply_patches("executorch", fired, select=is_backend_internal))
                with log.stage("fx-program-fixes"):
                    apply_fx_program_fixes("executorch", traced.program, log.applied)
                with log.stage("fx-node-fixes"):
                    apply_fx_node_fixes("executorch", traced.program.graph_module, log.applied)
                from executorch.exir import to_edge_transform_and_lower

                with log.stage("to-edge"):
                    edge = to_edge_transform_and_lower(traced.program, partitioner=partitioners)
                lowered = edge.exported_program()
                with log.stage("to-executorch"):
                    program = edge.to_executorch(_with_initial_states(lowered)).buffer
                mutated_inputs = sum(
                    spec.kind.name == "USER_INPUT_MUTATION" for spec in lowered.graph_signature.output_specs
                )
        finally:
            log.note(sorted(fired))
        metadata = build_metadata("executorch", model, traced, config, log)
        # counted after lowering: functionalization turns in-place updates of inputs into leading outputs
        metadata["mutated_inputs"] = mutated_inputs
        return ExecutorchExported(program, metadata)


def _with_initial_states(program):
    """ExecuTorch plans a buffer the program updates as scratch memory, with no initial value: the program read
    zeros where eager read the buffer (CTRL reassigns its position table to itself, cast to the embeddings' dtype,
    which the trace records as an update). Every updated buffer starts from its value, as in eager."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    signature = program.graph_signature
    updated = set(signature.buffers_to_mutate.values())
    placeholders = [name for name, buffer in signature.inputs_to_buffers.items() if buffer in updated]
    return ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(placeholders)] if placeholders else [])


def execution_plan(program: bytes):
    """The serialized program's plan for `forward`: its operators, its planned memory buffers."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    deserialized = deserialize_pte_binary(program)
    return getattr(deserialized, "program", deserialized).execution_plan[0]  # newer releases wrap it with segments


def _operators_without_kernels(program: bytes) -> list[str]:
    """The operators a serialized program calls that the runtime registers no kernel for."""
    from executorch.extension.pybindings.portable_lib import _get_operator_names

    called = {f"{op.name}.{op.overload}" if op.overload else op.name for op in execution_plan(program).operators}
    return sorted(called - set(_get_operator_names()))


# ── Stage 1: Backend preparation ─────────────────────────────────────────────
# `@register_executorch_backend(name)` on `prepare_for_<name>(model) -> partitioners`.


@register_executorch_backend("xnnpack")
def prepare_for_xnnpack(model):
    """XNNPACK: float32 on the CPU, delegated subgraphs where XNNPACK has kernels, the portable ops elsewhere."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    model.to(device="cpu").float()  # floating tensors only: `.to(dtype)` drops complex buffers' imaginary part
    return [XnnpackPartitioner()]


def warm_up_xnnpack() -> None:
    """Build now what XNNPACK's lowering builds on first use and keeps for the process's life: reference SDPA and
    bilinear-upsampling graphs, traced and lowered (about 3 s), to match patterns against. A sweep calls this in its
    parent, so no forked child pays it again. On one intra-op thread: children forked after an OpenMP pool has
    started hang in their first parallel op."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        bilinear_2d.get_graphs()
        sdpa.get_graphs()
    finally:
        torch.set_num_threads(threads)


@register_executorch_backend("portable")
def prepare_for_portable(model):
    """Portable: ExecuTorch's reference kernels only, no delegate."""
    model.to(device="cpu").float()
    return []


@register_executorch_backend("cuda")
def prepare_for_cuda(model):
    """CUDA: the ExecuTorch CUDA delegate, which needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("the ExecuTorch 'cuda' backend needs a CUDA device, and this machine has none")
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    model.to(device="cuda")
    return [CudaPartitioner([])]


# ── Stage 2: Torch patches ───────────────────────────────────────────────────
# `@register_patch("executorch", "torch.<op>")`: ops the ExecuTorch backends cannot take as the model calls them.


# the runtime has no running maximum or minimum either (Grounding DINO's special-token spans)
register_patch("executorch", "torch.cummax", "torch.cummin")(_patch_running_extremes_by_comparison)


@register_patch("executorch", "torch.nn.functional.conv3d", reports=True)
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


@register_patch("executorch", "torch.bucketize")
def _patch_bucketize_as_comparison(original):
    """`bucketize` is not in the Core ATen opset the edge dialect checks, and the portable runtime has no kernel
    for it (https://github.com/pytorch/executorch/issues/20270; Idefics3's patch positions). A bucket index is
    the number of boundaries below the value (at or below it with `right=True`): a comparison and a sum."""

    def bucketize(input, boundaries, *, out_int32=False, right=False, **kwargs):
        if kwargs or not isinstance(input, torch.Tensor):
            return original(input, boundaries, out_int32=out_int32, right=right, **kwargs)
        return _insertion_points(boundaries, input, right, out_int32)

    return bucketize


@register_patch("executorch", "torch.searchsorted")
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


@register_patch("executorch", "torch.repeat_interleave", "torch.Tensor.repeat_interleave")
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


@register_patch("executorch", "torch.randint")
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


@register_patch("executorch", "torch.nn.functional.interpolate", reports=True)
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
            return _resize_weights(torch.full_like(positions, count), positions, source, True, mode)

        resized = input.float() @ weights(columns, input.shape[-1]).T
        return (weights(rows, input.shape[-2]) @ resized).to(input.dtype)

    return interpolate


@register_patch("executorch", "torch.nn.functional.embedding_bag")
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


@register_patch("executorch", "torch.scatter_reduce", "torch.Tensor.scatter_reduce")
def _patch_scatter_reduce_as_dense(original):
    """The portable runtime has no `scatter_reduce` kernel (TAPAS reduces its table cells per segment with it, BLT
    its bytes' states per patch). Along the scattered axis each output slot reduces the sources whose index is that
    slot: a comparison of every index with every slot on a new axis, then a masked reduction over the sources;
    slots no source reaches keep their value. Indices as wide as the output on the other axes only."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    reductions = ("sum", "mean", "amax", "amin")

    def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
        dim %= max(input.dim(), 1)
        if (not input.is_floating_point() or reduce not in reductions or index.dim() != input.dim()
                or not all(statically_known_true(index.shape[axis] == input.shape[axis])
                           for axis in range(input.dim()) if axis != dim)):  # fmt: skip
            return original(input, dim, index, src, reduce, include_self=include_self)
        slots = torch.arange(input.shape[dim], device=index.device).view([-1] + [1] * (input.dim() - dim))
        member = index.unsqueeze(dim) == slots  # (..., slot, source, ...)
        count = member.sum(dim=dim + 1)
        sources = src[tuple(slice(0, size) for size in index.shape)].to(input.dtype).unsqueeze(dim)
        if reduce in ("sum", "mean"):
            total = torch.where(member, sources, 0).sum(dim=dim + 1)
            if reduce == "sum":
                return input + total if include_self else torch.where(count > 0, total, input)
            if include_self:
                return (input + total) / (count + 1)
            return torch.where(count > 0, total / count.clamp(min=1), input)
        highest = reduce == "amax"
        fill = torch.finfo(input.dtype).min if highest else torch.finfo(input.dtype).max
        extreme = torch.where(member, sources, fill)
        extreme = extreme.amax(dim=dim + 1) if highest else extreme.amin(dim=dim + 1)
        if include_self:
            extreme = torch.maximum(extreme, input) if highest else torch.minimum(extreme, input)
        return torch.where(count > 0, extreme, input)

    return scatter_reduce


def _dft_angles(frequencies, size, like):
    """The angles of a ``size``-point DFT matrix's first ``frequencies`` rows, in ``like``'s dtype."""
    rows, columns = torch.arange(frequencies, device=like.device), torch.arange(size, device=like.device)
    return (rows[:, None] * columns[None, :] % size).to(like.dtype) * (2 * math.pi / size)  # exact turns first


@register_patch("executorch", "transformers.models.fnet.modeling_fnet.FNetBasicFourierTransform.forward")
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


# ── Stage 3: ExecuTorch patches ──────────────────────────────────────────────
# `@register_patch("executorch", "executorch.<internal>")`: lowering steps that fail on valid graphs.

# `to_edge` traces the program again, asking the same contiguity questions as the first trace
register_patch("executorch", "torch._prims_common.is_contiguous", reports=True)(_patch_contiguity_asked_without_guards)


def _dynamic_axes(node) -> int:
    from torch.fx.experimental.symbolic_shapes import free_symbols

    value = node.meta.get("val")
    return sum(bool(free_symbols(size)) for size in value.shape) if isinstance(value, torch.Tensor) else 0


def _xnnpack_check_refusing(original, refuses):
    """An XNNPACK config's node check that also refuses the nodes `refuses` picks: they stay on the portable kernels."""

    def check(self, node, exported_program):
        if refuses(node):
            report_applied()
            return False
        return original(self, node, exported_program)

    return check


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints",
    reports=True,
)
def _patch_xnnpack_reshape_dynamic_axes(original):
    """XNNPACK takes a 1-D convolution or batch norm (it wraps them in unsqueeze/squeeze) or an unsqueeze with two
    dynamic axes, then its reshape refuses them ("XNNPACK reshape only supports 1 dynamic dimension"; wav2vec2's
    feature encoder, Parakeet's convolution module, with dynamic batch and audio length). Such nodes stay on the
    portable kernels instead. The reshape's one-dynamic-dimension limit: https://github.com/pytorch/executorch/pull/2976"""

    def reshapes_two_dynamic_axes(node):
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else node
        unsqueeze = "unsqueeze" in str(node.target)
        is_1d = len(getattr(source.meta.get("val"), "shape", ())) == 3
        return (unsqueeze or is_1d) and max(_dynamic_axes(source), _dynamic_axes(node)) > 1

    return _xnnpack_check_refusing(original, reshapes_two_dynamic_axes)


@register_patch(
    "executorch", "executorch.backends.xnnpack.partition.config.generic_node_configs.GeluConfig.check_constraints",
    reports=True,
)
def _patch_xnnpack_exact_gelu_only(original):
    """XNNPACK serialises every GELU as the exact one and ignores `approximate="tanh"` (fixed after ExecuTorch
    1.5.1: https://github.com/pytorch/executorch/pull/22851); through TIPSv2's DPT head the 5e-4 difference grew to
    0.075. A tanh GELU stays on the portable kernel, which computes the tanh form."""

    def approximate(node):
        return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") != "none"

    return _xnnpack_check_refusing(original, approximate)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig.check_common_constraints",
    reports=True,
)
def _patch_xnnpack_rank_limit(original):
    """XNNPACK defines tensors of at most six axes, yet its partitioner takes a node of any rank: Perceiver's
    space-to-depth (an 8-axis permute) lowers, then the program fails to load ("Failed to define tensor", 0x1). A
    node that reads or writes a tensor past that rank stays on the portable kernels."""
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def past_the_rank_limit(node):
        values = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.all_input_nodes)]
        return any(isinstance(value, torch.Tensor) and value.dim() > XNN_MAX_TENSOR_DIMS
                   for value in torch.utils._pytree.tree_leaves(values))

    return _xnnpack_check_refusing(original, past_the_rank_limit)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.CloneDimOrderConfig.check_constraints",
    reports=True,
)
def _patch_xnnpack_copies_of_shared_values(original):
    """XNNPACK takes a copy that keeps the layout, then removes it from its partition as a no-op: where the value it
    copies leaves the partition too (RecurrentGemma's convolution output, transposed for its scan), the partition
    returns that value twice, which XNNPACK refuses ("Output node ... is already in the inputs"). A copy of a value
    read elsewhere stays on the portable kernels."""

    return _xnnpack_check_refusing(original, lambda node: len(node.args[0].users) > 1)


@register_patch(
    "executorch",
    "executorch.exir.backend.canonical_partitioners.group_partitioner.GroupBasedPartitioner.propose_partitions",
    reports=True,
)
def _patch_partitions_out_of_rings(original):
    """XNNPACK's group partitioner merges any two partitions whose union no path leaves and re-enters, judged on the
    graph's nodes, not on the partitions merged so far: each partition can pass and the partitions still feed one
    another in a ring, which lowering cannot fuse ("Invalid partition, found dependency cycles"; FLAVA's
    pretraining model). A partition in a ring is split where a path out of it comes back in."""
    from torch.fx.passes.infra.partitioner import Partition

    def propose_partitions(self):
        partitions = original(self)
        next_id = itertools.count(max((partition.id for partition in partitions), default=-1) + 1)
        while True:
            owner = {node: partition for partition in partitions for node in partition.nodes}
            ringed = _partitions_in_rings(partitions, owner)
            if not ringed:
                return partitions
            for partition in ringed:
                reentered = _reentered_nodes(partition, owner)
                # all of it only where another partition of the ring holds an earlier node: that one splits
                if 0 < len(reentered) < sum(node.op != "placeholder" for node in partition.nodes):
                    report_applied()
                    for node in reentered:
                        partition.remove_node(node)
                    partitions.append(Partition(id=next(next_id), nodes=reentered))
                    break
            else:
                raise AssertionError("a ring of partitions none of which a path re-enters")

    return propose_partitions


def _partition_edges(owner):
    """The graph with each partition (`owner` maps its nodes to it) as one node: the users of each node or
    partition. Constants a partition holds lead nowhere: the lowering copies them into every partition reading them."""
    users = collections.defaultdict(set)
    for node in next(iter(owner)).graph.nodes if owner else ():
        if node.op != "placeholder":
            source = owner.get(node, node)
            users[source].update(owner.get(user, user) for user in node.users)
            users[source].discard(source)
    return users


def _partitions_in_rings(partitions, owner) -> list:
    """The partitions on or past a cycle of the partition graph (what Kahn's order cannot reach), in order."""
    users = _partition_edges(owner)
    waiting = collections.Counter(user for targets in users.values() for user in targets)
    ready = [source for source in users if not waiting[source]]
    while ready:
        for user in users[ready.pop()]:
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return [partition for partition in partitions if waiting[partition] > 0]


def _reentered_nodes(partition, owner) -> list:
    """The nodes of `partition` that a path leaving it reaches, through other nodes and whole other partitions."""
    reached, expanded = set(), {partition}
    frontier = [user for node in partition.nodes if node.op != "placeholder" for user in node.users
                if owner.get(user) is not partition]
    while frontier:
        node = frontier.pop()
        if node in reached:
            continue
        reached.add(node)
        frontier.extend(node.users)
        other = owner.get(node)
        if other is not None and other not in expanded:  # a partition runs as one: all its outputs follow
            expanded.add(other)
            frontier.extend(user for member in other.nodes if member.op != "placeholder" for user in member.users)
    return [node for node in partition.nodes if node in reached]


@register_patch(
    "executorch", "executorch.exir.verification.arg_validator.EdgeOpArgValidator.call_function", reports=True
)
def _patch_edge_validator_list_return(original):
    """The edge dialect's dtype validator walks an op's lone `Tensor[]` return (split, unbind) as if each tensor
    were a return, then takes `len()` of the first tensor: with a dynamic first axis, that `len` is a guard that
    pins the axis (the batch) to its traced size and the program rejects any other. Handed the list wrapped in a
    one-item list, the validator walks the single list return it is."""

    def call_function(self, target, args, kwargs):
        returns = getattr(getattr(target, "_schema", None), "returns", ())
        value = self.node.meta.get("val")
        if len(returns) != 1 or returns[0].type != torch.ListType.ofTensors() or not isinstance(value, (list, tuple)):
            return original(self, target, args, kwargs)
        report_applied()
        self.node.meta["val"] = [value]
        try:
            return original(self, target, args, kwargs)
        finally:
            self.node.meta["val"] = value

    return call_function


@register_patch("executorch", "executorch.exir.program._program.EXIREdgeDialectVerifier", reports=True)
def _patch_edge_verifier_python_symbolic_ops(original):
    """Size arithmetic traced as a Python function (NLLB-MoE's dynamic expert capacity, `torch.sym_float`; a tensor
    condition's `sym_ite`, a size's `sym_not` in the runtime asserts `to_edge` brings back when it traces again):
    the edge verifier refuses Python functions, although `to_executorch` swaps each for its `executorch_prim` op.
    The verifier lets those through."""
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS

    swapped_later = {op for op in _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS if isinstance(op, types.FunctionType)}

    def EXIREdgeDialectVerifier(*args, **kwargs):
        verifier = original(*args, **kwargs)
        verifier_class = verifier if isinstance(verifier, type) else type(verifier)
        check, report = verifier_class.check_valid_edge_op, applied_reporter()

        def check_valid_edge_op(self, op):
            if op in swapped_later:
                report()
                return None
            return check(self, op)

        verifier_class.check_valid_edge_op = check_valid_edge_op
        if not isinstance(verifier, type):
            verifier.check_valid_op = verifier.check_valid_edge_op
        return verifier

    return EXIREdgeDialectVerifier


@register_patch("executorch", "executorch.exir.emit._emitter._Emitter._emit_scan", reports=True)
def _patch_scan_carries_resized(original):
    """ExecuTorch runs a `scan` as a loop that writes each carry into its buffer with `copy_`, which never resizes
    the buffer, and stacks each step's output with `et_copy_index`, which compares the step with the stack's
    trailing sizes as planned (the upper bounds). A scan whose carries have a dynamic axis (a batch of 3 in a
    program traced with 2) fails at run time (0x12); a dynamic scan length alone runs. The carries are written with
    `clone.out`, which resizes its output, and before each stacking the stack is resized (`empty.out`, which keeps
    its memory) to the rows it holds and the step's sizes."""
    from executorch.exir.schema import EValue, Instruction, Int, IntList, KernelCall, Null
    from torch.fx.experimental.symbolic_shapes import free_symbols

    def _emit_scan(self, args, outputs):
        carry_count = len(args[1])
        if not any(free_symbols(value.shape) for value in self.node.meta["val"][:carry_count]):
            return original(self, args, outputs)
        report_applied()
        start = len(self.chain.instructions)
        emitted = original(self, args, outputs)
        carries = {value.id for value in outputs[:carry_count]}
        operator = {name: self._get_operator(name=name, overload=overload)[0] for name, overload in (
            ("aten::copy_", ""), ("aten::clone", "out"), ("aten::sym_size", "int"), ("aten::empty", "out"),
            ("executorch_prim::et_copy_index", "tensor"))}  # fmt: skip
        null = self._emit_evalue(EValue(Null())).id
        instructions = self.chain.instructions[:start]
        for instruction in self.chain.instructions[start:]:
            call = instruction.instr_args
            if isinstance(call, KernelCall) and call.op_index == operator["aten::copy_"] and call.args[0] in carries:
                destination, source = call.args[0], call.args[1]
                call.op_index, call.args = operator["aten::clone"], [source, null, destination, destination]
            elif isinstance(call, KernelCall) and call.op_index == operator["executorch_prim::et_copy_index"]:
                stack, step, row = call.args
                sizes = [row]
                for axis in range(len(self.emitter_state.values[step].val.sizes)):
                    size = self._emit_evalue(EValue(Int(0))).id
                    instructions.append(Instruction(KernelCall(
                        operator["aten::sym_size"], [step, self._emit_evalue(EValue(Int(axis))).id, size])))
                    sizes.append(size)
                shape = self._emit_evalue(EValue(IntList(sizes))).id
                instructions.append(Instruction(KernelCall(operator["aten::empty"], [shape, null, stack, stack])))
            instructions.append(instruction)
        self.chain.instructions[:] = instructions
        return emitted

    return _emit_scan


@register_patch(
    "executorch",
    "executorch.exir.tensor.dim_order_from_stride",
    "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride",
    "executorch.exir.emit._emitter.dim_order_from_stride",
    reports=True,
)
def _patch_dim_order_of_contiguous_strides(original):
    """ExecuTorch orders a tensor's axes by sorting its strides. Strides holding a data-dependent size (the number
    of image tokens, counted from the input ids) often cannot be compared. When each stride is a multiple of the
    next, the axes are in contiguous order whatever the sizes turn out to be. The shape environment does not see
    every multiple (`8*(a + b) % 8` stays open): a quotient that is a whole expression is one too."""
    import sympy
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, guard_or_false

    def multiple(outer, inner):
        if guard_or_false(outer % inner == 0):
            return True
        as_expression = [getattr(getattr(size, "node", None), "expr", size) for size in (outer, inner)]
        return sympy.simplify(sympy.sympify(as_expression[0]) / as_expression[1]).is_integer is True

    def dim_order_from_stride(stride):
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            if not all(multiple(outer, inner) for outer, inner in zip(stride, stride[1:])):
                raise
            report_applied()
            return tuple(range(len(stride)))

    return dim_order_from_stride


@register_patch(
    "executorch",
    "executorch.exir.passes.prune_empty_tensors_pass.PruneEmptyTensorsPass.remove_empty_tensors_from_cat",
    reports=True,
)
def _patch_empty_cat_left_whole(original):
    """A `cat` of empty tensors only becomes a `full` of the cat's shape, written into the graph as size values: a
    symbolic size is no node there, and the emitter refuses it ("Unsupported type encountered in int list";
    MistralLarge 4's zero-width key cache, dynamic). Such a cat of a symbolic shape stays, empty inputs and all."""
    from torch.fx.experimental.symbolic_shapes import guard_or_true

    def remove_empty_tensors_from_cat(self, graph_module, cat_node):
        all_empty = not any(guard_or_true(arg.meta["val"].numel() != 0) for arg in cat_node.args[0])
        if all_empty and not all(isinstance(size, int) for size in cat_node.meta["val"].shape):
            report_applied()
            return
        original(self, graph_module, cat_node)

    return remove_empty_tensors_from_cat


@register_patch("executorch", "executorch.exir.passes.replace_view_copy_with_view_pass._is_view_copy", reports=True)
def _patch_views_as_dynamic_as_their_base(original):
    """ExecuTorch turns a `view_copy` into a view sharing its base's memory, and refuses one whose shape is static
    while its base's is dynamic ("_ViewSpec is incompatible with its base on creation"; BLT's patch starts, cut at a
    count read from data, then viewed at the size that count took). Such a view stays a copy."""
    from executorch.exir.tensor import determine_tensor_dynanism

    def is_view_copy(node):
        if not original(node):
            return False
        base_spec = node.args[0].meta.get("spec")
        if base_spec is not None and determine_tensor_dynanism(node.meta["val"].shape) != base_spec.shape_dynamism:
            report_applied()
            return False
        return True

    return is_view_copy


# the most input-size combinations a size's exact upper bound is searched over (an audio length by a batch: ~1e6)
_BOUND_SEARCH_LIMIT = 1 << 22
# A number read from data with nothing to bound it (a vocoder's frame count, summed from predicted durations; a
# split's offsets) is planned as lying within this many either side of zero.
_DATA_DEPENDENT_CEILING = 4096


@register_patch(
    "executorch",
    "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound",
    "executorch.exir.sym_util.eval_upper_bound",  # what `eval_shape_upper_bound` calls
    reports=True,
)
def _patch_sizes_bounded_exactly(original):
    """ExecuTorch plans memory for each size's upper bound, found by interval arithmetic over the expression: a
    symbol met twice is bounded as two independent ones, and a quotient takes its numerator's top over its
    denominator's bottom. XLNet's relative shift sizes an axis `length**2 // length`, bounded so at 130,560 where
    it is at most 511: its program planned 137 GB (`std::bad_alloc` at load). Over few enough input sizes, the
    expression's largest value is found exactly.

    A size that depends on a number read from data with no bound of its own has none ("Cannot evaluate a finite
    upper bound"); that number is taken within `_DATA_DEPENDENT_CEILING` either side of zero, and past it the
    runtime refuses to resize the tensor.

    Where interval arithmetic finds no finite bound but the size has a traced value, ExecuTorch plans that value
    silently: Swin2SR's window reverse (`height // (height // window)`, a quotient by a floor that may be 0) was
    planned for the traced batch, and a batch of 3 ran out of room ("Attempted to resize a bounded tensor")."""
    import numpy
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

    largest = {}  # (expression, ranges) -> its largest value, or None where it cannot be found

    def search(expr, symbols, spans):
        if not symbols or any(span.upper is int_oo or span.lower is -int_oo for span in spans):
            return None
        axes = [numpy.arange(int(span.lower), int(span.upper) + 1) for span in spans]
        if not 0 < math.prod(len(axis) for axis in axes) <= _BOUND_SEARCH_LIMIT:  # 0: a range with no value
            return None
        functions = {"FloorDiv": numpy.floor_divide, "PythonMod": numpy.mod, "Max": numpy.maximum,
                     "Min": numpy.minimum}
        try:
            values = sympy.lambdify(symbols, expr, modules=[functions, "numpy"])(*numpy.meshgrid(*axes))
        except (NameError, TypeError, ValueError, ZeroDivisionError):  # a function with no numpy form
            return None
        return int(numpy.max(values))

    def planned(symbol, span):
        if span is None or not str(symbol).startswith("u"):  # an input size (s0...) keeps its range
            return span
        lower = span.lower if isinstance(span.lower, sympy.Integer) else -_DATA_DEPENDENT_CEILING
        bounded = isinstance(span.upper, sympy.Integer) and span.upper < sys.maxsize - 1  # int64's top: no bound
        upper = span.upper if bounded else max(lower, _DATA_DEPENDENT_CEILING)
        return ValueRanges(lower, upper)

    def find_largest(expr, symbols, spans):
        exact = search(expr, symbols, spans)
        if exact is not None:
            return exact
        upper = bound_sympy(expr, dict(zip(symbols, spans))).upper
        return int(upper) if isinstance(upper, sympy.Integer) else None

    def eval_upper_bound(size):
        if isinstance(size, int):
            return size
        bound, unbounded = None, None
        try:
            bound = original(size)
        except RuntimeError as error:  # no finite bound, nor a traced value
            unbounded = error
        shape_env = size.node.shape_env
        original_expr, ranges = size.node.expr, shape_env.var_to_range
        expr = _counts_at_their_ceilings(original_expr, shape_env)
        symbols = sorted(expr.free_symbols, key=str)
        spans = tuple(planned(symbol, ranges.get(symbol)) for symbol in symbols)
        if None not in spans:
            key = (expr, spans)
            if key not in largest:
                largest[key] = find_largest(expr, symbols, spans)
            found = largest[key]
            # where interval arithmetic finds no bound, the original's number is the traced size, no bound
            if found is not None and (bound is None or found < bound
                                      or not isinstance(bound_sympy(original_expr, ranges).upper, sympy.Integer)):
                report_applied()
                return found
        if unbounded is not None:
            raise unbounded
        return bound

    return eval_upper_bound


def _counts_at_their_ceilings(expr, shape_env):
    """``expr`` with each number read from data that has a known ceiling (a fact ``u <= c`` of the shape
    environment, ``c`` of input sizes only) replaced by it, where ``expr`` does not shrink as the number grows: the
    largest value over the inputs' sizes is then an upper bound that keeps the tie between the count and the sizes
    (VideoMAE's visible tokens per sample, `count // batch`, at most the patches per sample, not the whole batch's
    count over a batch of 2)."""
    import sympy

    for symbol in sorted(expr.free_symbols, key=str):
        if not str(symbol).startswith("u"):
            continue
        for fact in shape_env.deferred_runtime_asserts.get(symbol, ()):
            relation = fact.expr
            if isinstance(relation, sympy.GreaterThan):
                relation = sympy.Le(relation.rhs, relation.lhs, evaluate=False)
            if not isinstance(relation, sympy.LessThan) or relation.lhs != symbol:
                continue
            ceiling = relation.rhs
            if ceiling.free_symbols and all(str(free).startswith("s") for free in ceiling.free_symbols):
                if _nondecreasing(expr, symbol, shape_env):
                    expr = expr.xreplace({symbol: ceiling})
                break
    return expr


def _nondecreasing(expr, symbol, shape_env) -> bool:
    """Whether ``expr`` cannot shrink as ``symbol`` grows, told from its form alone (sums, products of nonnegative
    terms, floor divisions by a positive divisor, maxima and minima). False when unsure."""
    import sympy

    if symbol not in expr.free_symbols:
        return True
    if expr == symbol:
        return True

    def nonnegative(term):
        return shape_env.bound_sympy(term).lower >= 0

    name = type(expr).__name__
    if isinstance(expr, sympy.Add) or name in ("Max", "Min"):
        return all(_nondecreasing(term, symbol, shape_env) for term in expr.args)
    if isinstance(expr, sympy.Mul):
        return all(nonnegative(term) and _nondecreasing(term, symbol, shape_env) for term in expr.args)
    if name == "FloorDiv":
        numerator, divisor = expr.args
        return symbol not in divisor.free_symbols and shape_env.bound_sympy(divisor).lower > 0 and (
            _nondecreasing(numerator, symbol, shape_env))
    if isinstance(expr, sympy.Pow):
        base, exponent = expr.args
        return exponent.is_Integer and exponent > 0 and nonnegative(base) and _nondecreasing(base, symbol, shape_env)
    return False


@register_patch(
    "executorch", "executorch.exir.passes.sym_shape_eval_pass.ConstraintBasedSymShapeEvalPass.call", reports=True
)
def _patch_counts_of_selected_elements_at_most_their_number(original):
    """A boolean mask's selection (`x[mask]`, `nonzero`) counts at most the mask's elements, yet the trace bounds the
    count by the largest mask alone, not by the mask's own size: the count is tied to the batch no more. Before
    ExecuTorch plans memory from sizes' upper bounds, each such count gets the fact ``count <= mask's elements``,
    which the bound search (`_counts_at_their_ceilings`) uses. VideoMAE pre-training, dynamic, planned
    (32, 4, 1024, 1024) attention scores for 32 tokens per sample: 0x21 at load."""
    import sympy

    aten = torch.ops.aten

    def counted(node):  # the mask a node's unknown count counts, or None
        target = getattr(node.target, "_op", node.target)  # an edge operator wraps its ATen one
        if target is aten.nonzero.default:
            return node.args[0]
        if target is aten.index.Tensor:
            masks = [index for index in node.args[1] if isinstance(index, torch.fx.Node)
                     and index.meta["val"].dtype == torch.bool]  # fmt: skip
            return masks[0] if len(node.args[1]) == 1 and len(masks) == 1 else None
        return None

    def call(self, graph_module):
        for module in graph_module.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.nodes:
                mask = counted(node) if node.op == "call_function" else None
                value = node.meta.get("val")
                if mask is None or not isinstance(value, torch.Tensor) or not isinstance(value.shape[0], torch.SymInt):
                    continue
                # ExecuTorch's passes may rerun a node without keeping the record of the count it binds
                count, shape_env = value.shape[0].node.expr, value.shape[0].node.shape_env
                if not count.is_symbol or not str(count).startswith("u"):
                    continue
                sizes = [size if isinstance(size, int) else size.node.expr for size in mask.meta["val"].shape]
                at_most = sympy.Le(count, math.prod(sizes))
                if shape_env._maybe_evaluate_static(at_most) is None:
                    shape_env.guard_or_defer_runtime_assert(at_most, "a selection counts at most its mask's elements")
                    report_applied()
        return original(self, graph_module)

    return call


@register_patch("executorch", "torch.export.exported_program._convert_guards_to_code", reports=True)
def _patch_guards_left_unprinted(original):
    """Each partition a backend lowers becomes an ExportedProgram, which prints every guard of the shared shape
    environment as Python, kept only to check the inputs of its `.module()`: the lowered program never runs them. A
    model with many guards prints them all again for each partition (Qwen3.5-MoE, dynamic: `to_edge` 542 s with
    the printing, 456 s without)."""

    from torch.export.exported_program import _get_shape_env

    def convert_guards_to_code(graph_module):
        shape_env = _get_shape_env(graph_module)
        if shape_env is not None and shape_env.guards:
            report_applied()
        return []

    return convert_guards_to_code


@register_patch("executorch", "torch.fx.traceback.NodeSource.__init__")
def _patch_node_history_shared(original):
    """A node made from another records its source with a deep copy of the source's whole history. Every pass of
    `to_edge`, and of each partition XNNPACK lowers, adds a step to every history, so the copies grow with the
    square of the passes (FunnelForMaskedLM, dynamic: `to_edge` 354 s with them, 258 s without, the same program).
    Nothing changes a recorded history, so the new record shares its source's."""

    def __init__(self, node, pass_name="", action=None):
        original(self, None, pass_name, action)
        if node:
            self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))

    return __init__


@register_patch("executorch", "executorch.exir.tensor.TensorSpec.from_tensor", reports=True)
def _patch_contiguous_order_below_four_axes(original):
    """ExecuTorch orders a tensor's axes by sorting its strides, yet below four axes it has no order but the
    contiguous one (channels last needs four), and its kernels write their outputs so. `nonzero`'s [count, rank]
    result is strided like a transposed tensor, as in eager: for a vector ([count, 1]) that gave the dim order
    (1, 0), which the portable kernels that take it next (squeeze, select, slice) refuse ("different dim orders",
    0x12 at run time); for a matrix with an unknown count the strides cannot even be sorted ("Could not guard on
    data-dependent expression", SuperPoint's keypoints). Such tensors get contiguous strides."""
    from executorch.exir.tensor import contiguous_stride_from_shape
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    def from_tensor(cls, tensor, const=False):
        if const or tensor.dim() > 3:
            return original(tensor, const)
        contiguous_order = tuple(range(tensor.dim()))
        try:
            spec = original(tensor, const)
        except GuardOnDataDependentSymNode:
            spec = cls(dtype=tensor.dtype, shape=tensor.shape, layout=tensor.layout, is_sparse=tensor.is_sparse)
            spec.requires_grad, spec.storage, spec.dim_order = tensor.requires_grad, None, None
        if tuple(spec.dim_order or ()) != contiguous_order:
            report_applied()
            spec.stride, spec.dim_order = contiguous_stride_from_shape(spec.shape), contiguous_order
        return spec

    return from_tensor


# ── Stage 4: FX program fixes ────────────────────────────────────────────────
# `@register_fx_program_fix("executorch")`: `fix(exported_program) -> bool`.

# An axis left unbounded by Dim.AUTO may grow to this many times its traced size (and at least to the floor).
_DYNAMIC_GROWTH = 4
_DYNAMIC_FLOOR = 32


@register_fx_program_fix("executorch")
def _fix_unbounded_dynamic_axes(exported_program) -> bool:
    """ExecuTorch plans memory for a dynamic axis' upper bound; an unbounded axis gets only its traced size.

    Gives every unbounded symbol a finite bound, in both places ExecuTorch reads: the program's range constraints
    and the shape environment's ranges.
    """
    from torch.utils._sympy.numbers import IntInfinity
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = next(
        (
            node.meta["val"].fake_mode.shape_env
            for node in exported_program.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor) and getattr(node.meta["val"], "fake_mode", None)
        ),
        None,
    )
    traced_sizes = shape_env.backed_var_to_val if shape_env is not None else {}
    changed = False
    for ranges in (exported_program.range_constraints, shape_env.var_to_range if shape_env else {}):
        for symbol, bounds in list(ranges.items()):
            # only input axes (backed symbols, s0...): a data-dependent size (u0...) has no traced value to grow from
            if not isinstance(bounds.upper, IntInfinity) or str(symbol).startswith("u"):
                continue
            # a key may be an expression of symbols: X-Codec 2's samples, 320 per frame of its features (320*s37)
            traced = symbol.xreplace(traced_sizes)
            traced = int(traced) if traced.is_number and traced.is_finite else 2
            lower = bounds.lower if bounds.lower.is_finite else 0
            ranges[symbol] = ValueRanges(lower, max(traced * _DYNAMIC_GROWTH, _DYNAMIC_FLOOR))
            changed = True
    return changed


def _count_ceiling(node):
    """The largest value a count of booleans can take (their sum over some axes, or the largest or smallest of such
    sums): the number of elements summed, in the input's sizes (symbols where they are dynamic). None for a tensor
    that is no such count."""
    aten = torch.ops.aten
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    source = node.args[0]
    if node.target in (aten.max.default, aten.amax.default, aten.min.default, aten.amin.default):
        return _count_ceiling(source)
    if node.target not in (aten.sum.dim_IntList, aten.sum.default):
        return None
    each = 1 if source.meta["val"].dtype == torch.bool else _count_ceiling(source)
    shape = source.meta["val"].shape
    axes = node.args[1] if node.target is aten.sum.dim_IntList and node.args[1] else range(len(shape))
    sizes = [shape[axis] if isinstance(shape[axis], int) else shape[axis].node.expr for axis in axes]
    return None if each is None else each * math.prod(sizes)


def _position_ceiling(node):
    """The largest value a coordinate found by `nonzero` can take: its axis' size less one. `node` picks one such
    coordinate from `nonzero`'s (count, axes) output, by a row then a column. None for anything else."""
    aten = torch.ops.aten
    column = None
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target is aten.nonzero.default:
            if column is None:
                return None
            size = node.args[0].meta["val"].shape[column]
            return (size if isinstance(size, int) else size.node.expr) - 1
        if node.target is operator.getitem and node.args[0].target is aten.unbind.int and column is None:
            unbound, column = node.args[0], node.args[1]
            if unbound.args[1:] not in ((), (0,)) or unbound.args[0].meta["val"].dim() != 1:
                return None
            node = unbound.args[0]
        elif node.target is aten.select.int and node.args[1] == 0:
            if node.args[0].meta["val"].dim() == 1 and column is None:
                column = node.args[2]
            elif node.args[0].meta["val"].dim() != 2 or column is None:
                return None
            node = node.args[0]
        else:
            return None
    return None


@register_fx_program_fix("executorch")
def _fix_counts_read_from_data_bounded(exported_program) -> bool:
    """A number read from data has no known range, and to_edge's slice decomposition asks whether a slice's end is
    negative (counted from the back) or past the axis: "Could not guard on data-dependent expression u22 < 0", or
    "u22 > s69 - 1" on a dynamic axis; and a `select` at such a number whether it is inside the axis. BLT cuts its
    patch starts at the largest count of entropy peaks: a count of booleans, between 0 and the number of them
    counted. ESMFold reads its best alignment's score at the coordinates `nonzero` finds: between 0 and the axis'
    size less one. Such numbers get that range in the shape environment, and where the ceiling is symbolic, the
    fact that they do not exceed it."""
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges

    reads = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
    changed = False
    for node in exported_program.graph.nodes:
        value = node.meta.get("val")
        if node.target not in reads or not isinstance(value, torch.SymInt) or not value.node.expr.is_symbol:
            continue
        ceiling = _count_ceiling(node.args[0])
        ceiling = _position_ceiling(node.args[0]) if ceiling is None else ceiling
        shape_env, count = value.node.shape_env, value.node.expr
        bounds = shape_env.var_to_range.get(count)
        if ceiling is None or bounds is None:
            continue
        ceiling = sympy.sympify(ceiling)
        narrowed = bounds & ValueRanges(0, shape_env.bound_sympy(ceiling).upper)
        if narrowed != bounds:
            shape_env.var_to_range[count] = narrowed
            changed = True
        at_most = sympy.Le(count, ceiling)
        if ceiling.free_symbols and shape_env._maybe_evaluate_static(at_most) is None:
            # true of every count; the shape environment takes facts about unknown numbers as runtime asserts
            shape_env.guard_or_defer_runtime_assert(at_most, "a count of booleans is at most their number")
            changed = True
    return changed


@register_fx_program_fix("executorch")
def _fix_slices_to_a_count_as_long_as_it(exported_program) -> bool:
    """The trace gave ``x[:, :count]`` a fresh unknown length: it could not tell the count from the width. Once
    the count is known not to exceed the width (above), a retrace finds the count itself as that length, and
    to_edge's rebinding of the old symbol to it fails on the next retrace ("u2 possible memo disaster"; BLT's
    patch starts on a dynamic axis). The length is made the count for good; the slice binds no symbol of its own."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    changed = False
    for node in exported_program.graph.nodes:
        if node.target is not torch.ops.aten.slice.Tensor or len(node.args) < 4 or node.args[2] not in (None, 0):
            continue
        count_node = node.args[3]
        count = getattr(count_node, "meta", {}).get("val")
        if not isinstance(count, torch.SymInt) or node.args[4:] not in ((), (1,)):
            continue
        source, dim = node.args[0].meta["val"], node.args[1]
        length = node.meta["val"].shape[dim]
        bindings = node.meta.get("unbacked_bindings") or {}
        if not isinstance(length, torch.SymInt) or set(bindings) != {length.node.expr}:
            continue
        if statically_known_true(count <= source.shape[dim]) and statically_known_true(count >= 0):
            count.node.shape_env._set_replacement(length.node.expr, count.node.expr, "a slice up to a count")
            del node.meta["unbacked_bindings"]
            changed = True
    return changed


# ── Stage 5: FX node fixes ───────────────────────────────────────────────────
# `@register_fx_node_fix("executorch")`: `fix(graph_module, node) -> bool`.


@register_fx_node_fix("executorch")
def _fix_attention_output_layout(graph_module, node) -> bool:
    """The trace takes SDPA's output strides from its fake kernel; to_edge's SDPA decomposition returns other
    strides, and a `view` the trace recorded downstream no longer fits ("Cannot view a tensor with shape [2, 7, 32]
    and strides (32, 64, 1)"; GPT-2's projection after attention). A contiguous copy of the output fixes its
    layout before anything is recorded on it, and the `view`s after it become `reshape`s (they copy only if they
    must; the graph is functional, nothing relies on the alias)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.scaled_dot_product_attention.default:
        return False
    if any(user.target is torch.ops.aten.clone.default for user in node.users):
        return False
    with graph_module.graph.inserting_after(node):
        copy = contiguous_copy(graph_module.graph, node)
    node.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
    pending = list(copy.users)
    while pending:  # the views recorded on the old layout
        user = pending.pop()
        if user.target is torch.ops.aten.view.default:
            user.target = torch.ops.aten.reshape.default
        if user.target in (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.transpose.int,
                           torch.ops.aten.permute.default):  # fmt: skip
            pending.extend(user.users)
    return True


def _call(graph, target, *args, **kwargs):
    """A node ``target(*args, **kwargs)`` at the graph's insertion point, with its fake value."""
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = target(*torch.fx.node.map_arg(args, lambda arg: arg.meta["val"]), **kwargs)
    return node


def _call_after(graph, anchor, target, *args, after=None):
    """A node ``target(anchor, *args)`` right after ``after`` (by default ``anchor``), with its fake value. The
    anchor may be a list of nodes (a concatenation's), given ``after``."""
    with graph.inserting_after(after or anchor):
        return _call(graph, target, anchor, *args)


# argument names of the convolutions a program may hold, in order
_CONVOLUTIONS = {
    torch.ops.aten.conv3d.default: ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    torch.ops.aten.convolution.default: (
        "input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups"
    ),
}


@register_fx_node_fix("executorch")
def _fix_patchify_conv3d(graph_module, node) -> bool:
    """Video and Qwen-VL patch embeddings are a 3-D convolution whose stride is its kernel (tubelets, or patches
    cut beforehand). ExecuTorch's portable convolution takes only 3-D and 4-D inputs and XNNPACK has no 3-D one:
    the same products are a linear layer over the flattened patches, which XNNPACK lowers."""
    if node.op != "call_function" or node.target not in _CONVOLUTIONS:
        return False
    options = {"bias": None, "stride": [1], "padding": [0], "dilation": [1], "transposed": False, "groups": 1}
    options.update(zip(_CONVOLUTIONS[node.target], node.args), **node.kwargs)
    source, weight, bias = options["input"], options["weight"], options["bias"]
    kernel = list(weight.meta["val"].shape[2:])
    spatial = list(source.meta["val"].shape[2:])
    stride = list(options["stride"]) * (3 if len(options["stride"]) == 1 else 1)
    plain = not options["transposed"] and options["groups"] == 1 and set(options["dilation"]) == {1}
    if len(kernel) != 3 or not plain or options["padding"] not in ([0], [0, 0, 0], (0, 0, 0)) or stride != kernel:
        return False
    if not all(isinstance(size, int) for size in spatial):
        return False
    out_channels, in_channels = weight.meta["val"].shape[:2]
    grid = [s // k for s, k in zip(spatial, kernel)]
    graph, aten = graph_module.graph, torch.ops.aten
    patches, first = source, node.prev  # the chain starts right before the convolution, after every input
    for axis, (size, k) in enumerate(zip(spatial, kernel)):
        if size % k:  # the convolution leaves out what no whole patch covers
            patches = _call_after(graph, patches, aten.slice.Tensor, axis + 2, 0, size - size % k, after=first)
            with graph.inserting_after(patches):
                patches = first = contiguous_copy(graph, patches)
    spatial = [g * k for g, k in zip(grid, kernel)]
    # Fold one axis at a time (XNNPACK takes at most 6 dims): rows end up (batch, depth, height, width) patches,
    # columns (channel, depth, height, width) within one, as the weight's.
    for axis, rest in ((0, [spatial[1] * spatial[2]]), (1, [spatial[2]]), (2, [])):
        folded = in_channels * math.prod(kernel[:axis])
        patches = _call_after(graph, patches, aten.view.default, [-1, folded, grid[axis], kernel[axis], *rest],
                              after=first)
        first = None
        patches = _call_after(graph, patches, aten.transpose.int, 1, 2)
        with graph.inserting_after(patches):
            patches = contiguous_copy(graph, patches)
    patches = _call_after(graph, patches, aten.view.default, [-1, in_channels * math.prod(kernel)])
    flat_weight = _call_after(graph, weight, aten.view.default, [out_channels, -1], after=patches)
    embedded = _call_after(graph, patches, aten.linear.default, flat_weight, bias, after=flat_weight)
    embedded = _call_after(graph, embedded, aten.view.default, [-1, *grid, out_channels])
    embedded = _call_after(graph, embedded, aten.permute.default, [0, 4, 1, 2, 3])
    node.replace_all_uses_with(embedded)
    graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_max_for_xnnpack(graph_module, node) -> bool:
    """XNNPACK's partitioner takes `max.dim` on any 4-D input; its lowering accepts only the dims 2 and 3 with the
    reduced axis kept ("amax.default only supports dim == 2 or dim == 3": GPT-OSS's attention sinks over
    `dim=-1`, Hiera's pooling over axis 1), and a max it does lower, followed by a softmax, comes out wrong (GPT-OSS
    logits off by 0.2). A 5-D max it leaves to the portable kernel: the input gains a leading axis of one, which
    each output drops again. Other ranks only get their axis counted from the front."""
    if node.op != "call_function" or node.target is not torch.ops.aten.max.dim:
        return False
    source, dim, *rest = node.args
    rank = source.meta["val"].dim()
    axis = dim % rank
    if rank != 4:
        node.args = (source, axis, *rest)
        return dim != axis
    _widen_by_a_leading_axis(graph_module.graph, node, axis + 1, *rest)
    return True


def _widen_by_a_leading_axis(graph, node, *args) -> None:
    """``node`` called as ``node.target(input, *args)`` on its input with a leading axis of one, which each of its
    outputs (one tensor, or a tuple read by `getitem`) drops again."""
    widened = _call_after(graph, node.args[0], torch.ops.aten.unsqueeze.default, 0, after=node.prev)
    node.args = (widened, *args)
    node.meta["val"] = node.target(widened.meta["val"], *args, **node.kwargs)
    if isinstance(node.meta["val"], torch.Tensor):
        outputs = [node]
    else:
        outputs = list(node.users)
        for output in outputs:
            output.meta["val"] = node.meta["val"][output.args[1]]
    for output in outputs:
        consumers = list(output.users)
        narrowed = _call_after(graph, output, torch.ops.aten.squeeze.dim, 0)
        for consumer in consumers:
            consumer.replace_input_with(output, narrowed)


@register_fx_node_fix("executorch")
def _fix_unbatched_pool_for_xnnpack(graph_module, node) -> bool:
    """A 2-D max pool of an unbatched (channels, height, width) input: XNNPACK's partitioner takes it, and its
    channels-last pass, which needs a batch axis, refuses it ("Attempting to convert non-NHWC compatible node to
    NHWC"; SuperPoint's non-maximum suppression pools its score maps so). The input gains a batch of one."""
    if node.op != "call_function" or node.target is not torch.ops.aten.max_pool2d.default:
        return False
    if node.args[0].meta["val"].dim() != 3:
        return False
    _widen_by_a_leading_axis(graph_module.graph, node, *node.args[1:])
    return True


@register_fx_node_fix("executorch")
def _fix_prelu_for_xnnpack(graph_module, node) -> bool:
    """XNNPACK's partitioner takes `prelu` of any rank but lowers it channels-last, which only a 4-D input has
    ("Attempting to convert non-NHWC compatible node to NHWC": DAB-DETR's PReLU after a linear, on 3-D tokens). A
    2-D or 3-D input gains trailing axes of one, which the output drops again; the channels stay on axis 1."""
    if node.op != "call_function" or node.target is not torch.ops.aten.prelu.default:
        return False
    source = node.args[0]
    rank = source.meta["val"].dim()
    if rank not in (2, 3):
        return False
    graph = graph_module.graph
    widened = source
    for axis in range(rank, 4):
        widened = _call_after(graph, widened, torch.ops.aten.unsqueeze.default, axis, after=node.prev)
    node.args = (widened, *node.args[1:])
    node.meta["val"] = torch.ops.aten.prelu.default(*torch.fx.node.map_arg(node.args, lambda arg: arg.meta["val"]))
    consumers = list(node.users)
    narrowed = _call_after(graph, node, torch.ops.aten.squeeze.dims, list(range(rank, 4)))
    for consumer in consumers:
        consumer.replace_input_with(node, narrowed)
    return True


@register_fx_node_fix("executorch")
def _fix_negative_padding_as_slice(graph_module, node) -> bool:
    """A negative pad crops, which the portable `constant_pad_nd` kernel refuses at run time ("Padding values must
    be non-negative"; RWKV's time shift pads one step in front and drops the last). The crops become slices, and
    what remains pads."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.constant_pad_nd.default, aten.pad.default):
        return False
    source, pad, *value = node.args
    if node.target is aten.pad.default:  # pad(input, pad, mode="constant", value=None)
        mode = value[0] if value else node.kwargs.get("mode", "constant")
        fill = value[1] if len(value) > 1 else node.kwargs.get("value")
        if mode != "constant":
            return False
        value = [] if fill is None else [fill]
    if not any(isinstance(amount, int) and amount < 0 for amount in pad):
        return False
    cropped = source
    for index in range(0, len(pad), 2):  # pairs (before, after) from the last axis backwards
        before, after = pad[index], pad[index + 1]
        if before < 0 or after < 0:
            dim = -(index // 2) - 1
            cropped = _call_after(graph_module.graph, cropped, aten.slice.Tensor, dim, max(-before, 0),
                                  after if after < 0 else sys.maxsize)
    node.target, node.kwargs = aten.constant_pad_nd.default, {}
    node.args = (cropped, [max(amount, 0) for amount in pad], *value)
    return True


@register_fx_node_fix("executorch")
def _fix_tail_slice_of_a_count_from_the_front(graph_module, node) -> bool:
    """`x[:, -count:]` with a count read from data (VideoMAE's decoder keeps the last `masked` tokens) starts at
    `-count`, and to_edge's slice decomposition asks whether that start is negative: "Could not guard on
    data-dependent expression -((u37//2)) < 0". The same tail starts at `size - count`, which is not. Only a count
    of 0 tells them apart (all tokens or none), and eager fails on it: nothing masked, nothing to reconstruct."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.slice.Tensor or len(node.args) < 3:
        return False
    source, dim, start = node.args[:3]
    from_back = getattr(start, "meta", {}).get("val")
    if not isinstance(from_back, torch.SymInt) or not free_unbacked_symbols(from_back):
        return False
    if statically_known_true(from_back >= 0) or not statically_known_true(from_back <= 0):
        return False
    with graph_module.graph.inserting_before(node):
        size = _call(graph_module.graph, aten.sym_size.int, source, dim)
        from_front = _call(graph_module.graph, operator.add, size, start)
    node.args = (source, dim, from_front, *node.args[3:])
    node.meta.pop("unbacked_bindings", None)  # the length follows from the new start: no fresh number to bind
    return True


@register_fx_node_fix("executorch")
def _fix_circular_padding_as_concatenation(graph_module, node) -> bool:
    """to_edge decomposes circular padding into an `empty` it fills, and the memory-format pass pins that `empty`'s
    symbolic sizes (Informer's token convolution pads circularly: its batch came out fixed). Wrapping around is
    the tensor between its last and first slices, one axis at a time."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.pad.default:
        return False
    source, pad = node.args[:2]
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    if mode != "circular" or not all(isinstance(amount, int) and amount >= 0 for amount in pad):
        return False
    graph, padded = graph_module.graph, source
    for index in range(0, len(pad), 2):  # pairs (before, after) from the last axis backwards
        before, after = pad[index], pad[index + 1]
        dim = source.meta["val"].dim() - index // 2 - 1
        last = _call_after(graph, padded, aten.slice.Tensor, dim, -before, sys.maxsize) if before else None
        first = _call_after(graph, padded, aten.slice.Tensor, dim, 0, after, after=last) if after else None
        parts = [part for part in (last, padded, first) if part is not None]
        if len(parts) > 1:
            padded = _call_after(graph, parts, aten.cat.default, dim, after=first or last)
    node.replace_all_uses_with(padded)
    graph.erase_node(node)
    return True


_INDEXED_SCATTERS = (torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default)


@register_fx_node_fix("executorch")
def _fix_scatter_index_as_int64(graph_module, node) -> bool:
    """ExecuTorch's edge dialect takes a scatter's index as int64 only and rejects the program otherwise ("mismatched
    dtypes"); GLM-5 Next counts its selected keys by an int32 index. The same index, widened."""
    if node.op != "call_function" or node.target not in _INDEXED_SCATTERS:
        return False
    index = node.args[2]
    if not isinstance(index, torch.fx.Node) or index.meta["val"].dtype != torch.int32:
        return False
    node.replace_input_with(index, _call_after(graph_module.graph, index, torch.ops.aten.to.dtype, torch.int64))
    return True


@register_fx_node_fix("executorch")
def _fix_alias_as_its_input(graph_module, node) -> bool:
    """A slice that keeps everything traces as `alias`, which ExecuTorch runs as a copy whose output it plans in the
    default dim order: when the input comes from a channels-last kernel, the copy refuses the mismatch at run time
    ("2 input tensors have different dim orders"; Swin2SR crops its upscaled image to the size it already has).
    The value is its input's."""
    if node.op != "call_function" or node.target is not torch.ops.aten.alias.default:
        return False
    source = node.args[0]
    if not isinstance(source, torch.fx.Node) or source.op == "placeholder":
        return False  # a program input returned as is stays a distinct value
    if any(user.op == "output" for user in source.users):
        return False  # and so does an output returned twice
    node.replace_all_uses_with(source)
    graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_slice_of_channels_last_from_a_contiguous_copy(graph_module, node) -> bool:
    """A slice of a channels-last tensor (a convolution's output over permuted tokens) is a view in eager; ExecuTorch
    runs it as `slice_copy`, whose output it plans contiguous, and its kernel refuses to copy between dim orders
    ("tensors_have_same_dim_order", 0x12; Swin2SR crops its upscaled image at a symbolic size). The slice reads a
    contiguous copy, which ExecuTorch makes with a kernel that converts dim orders."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return False
    source = node.args[0]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or guard_or_false(value.is_contiguous()):
        return False
    if not guard_or_false(value.is_contiguous(memory_format=torch.channels_last)):
        return False
    with graph_module.graph.inserting_before(node):
        copy = contiguous_copy(graph_module.graph, source)
    node.replace_input_with(source, copy)
    return True


def _has_no_elements(node) -> bool:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value is not None and any(isinstance(size, int) and size == 0 for size in value.shape)


@register_fx_node_fix("executorch")
def _fix_empty_cat_as_its_tensor(graph_module, node) -> bool:
    """A cache that starts as a 1-D tensor of no elements, which `cat` passes over, concatenated with a step's tensor
    of zero width (MistralLarge 4's layers without rope): the runtime's `cat` adds up the lengths of the tensors that
    have elements only, so the result lost its length (eager (3, 1, 9, 0), the program (3, 1, 0, 0)). It is the
    step's tensor."""
    if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
        return False
    passed_over = [tensor for tensor in node.args[0] if _has_no_elements(tensor) and tensor.meta["val"].dim() == 1]
    kept = [tensor for tensor in node.args[0] if tensor not in passed_over]
    if not passed_over or len(kept) != 1 or not _has_no_elements(kept[0]) or kept[0].op == "placeholder":
        return False
    node.replace_all_uses_with(kept[0])
    graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_nonzero_laid_out_by_rows(graph_module, node) -> bool:
    """`nonzero` of a matrix or more gives [count, rank] strided like a transposed tensor, as eager does, while the
    runtime's kernel writes it row by row. The strides spread to the ops that read it, and ExecuTorch turns strides
    into dim orders: (1, 0) has no memory format ("Failed to map a given dim_order", SuperPoint's keypoints). A
    contiguous copy follows it, and only its own spec is left to lay out by rows."""
    if node.op != "call_function" or node.target is not torch.ops.aten.nonzero.default:
        return False
    if node.meta["val"].shape[1] < 2:
        return False
    users = list(node.users)
    with graph_module.graph.inserting_after(node):
        copy = graph_module.graph.call_function(
            torch.ops.aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = torch.ops.aten.clone.default(node.meta["val"], memory_format=torch.contiguous_format)
    for user in users:
        user.replace_input_with(node, copy)
    return True


@register_fx_node_fix("executorch")
def _fix_integer_remainder_sign(graph_module, node) -> bool:
    """The runtime's integer `remainder` keeps the dividend's sign, as C's `%` does (-1 % 4 gives -1, eager 3):
    EfficientLoFTR places an unmatched keypoint, index -1, a whole image width to the left. Where the remainder
    and the divisor differ in sign, adding the divisor gives the floored one. Its `%` of sizes does the same:
    LongT5 pads its tokens to whole blocks by `-length % block`, got a negative padding, no block at all, and
    divided by that count (SIGFPE); there `(remainder + divisor) % divisor` has the divisor's sign."""
    aten = torch.ops.aten
    if node.op == "call_function" and node.target is operator.mod and isinstance(node.meta.get("val"), torch.SymInt):
        return _floor_size_remainder(graph_module.graph, node)
    if node.op != "call_function" or node.target not in (aten.remainder.Tensor, aten.remainder.Scalar):
        return False
    value, divisor = node.meta.get("val"), node.args[1]
    if value is None or value.dtype.is_floating_point or value.dtype == torch.bool:
        return False
    graph, users = graph_module.graph, list(node.users)
    divisor_value = divisor.meta["val"] if isinstance(divisor, torch.fx.Node) else divisor
    if isinstance(divisor_value, torch.Tensor):
        nonzero = _call_after(graph, node, aten.ne.Scalar, 0)
        signs_differ = _call_after(graph, _call_after(graph, node, aten.lt.Scalar, 0, after=nonzero), aten.ne.Tensor,
                                   _call_after(graph, divisor, aten.lt.Scalar, 0, after=nonzero))
        to_shift = _call_after(graph, nonzero, aten.logical_and.default, signs_differ, after=signs_differ)
        shifted = _call_after(graph, node, aten.add.Tensor, divisor, after=to_shift)
    else:  # a number, or a size the program computes (Mistral 3's patch count // 4)
        from torch.fx.experimental.symbolic_shapes import guard_or_false

        if guard_or_false(divisor_value > 0):
            to_shift = _call_after(graph, node, aten.lt.Scalar, 0)
        elif guard_or_false(divisor_value < 0):
            to_shift = _call_after(graph, node, aten.gt.Scalar, 0)
        else:
            return False
        shifted = _call_after(graph, node, aten.add.Scalar, divisor, after=to_shift)
    floored = _call_after(graph, to_shift, aten.where.self, shifted, node, after=shifted)
    for user in users:
        user.replace_input_with(node, floored)
    return True


def _floor_size_remainder(graph, node) -> bool:
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    dividend, divisor = (arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in node.args)
    if guard_or_false(dividend >= 0) and guard_or_false(divisor > 0):
        return False  # the same remainder either way
    users = list(node.users)
    with graph.inserting_after(node):
        shifted = graph.call_function(operator.add, (node, node.args[1]))
    shifted.meta["val"] = node.meta["val"] + divisor
    with graph.inserting_after(shifted):
        floored = graph.call_function(operator.mod, (shifted, node.args[1]))
    floored.meta["val"] = node.meta["val"]
    for user in users:
        user.replace_input_with(node, floored)
    return True


_CONJUGATES = (torch.ops.aten._conj.default, torch.ops.aten.conj.default, torch.ops.aten.conj_physical.default)


def _fft_arguments(node) -> tuple:
    """``(input, n, dim, norm)`` of an `fft_rfft` or `fft_irfft` node, defaults filled in."""
    named = dict(zip(("self", "n", "dim", "norm"), node.args)) | node.kwargs
    return named["self"], named.get("n"), named.get("dim", -1), named.get("norm")


@register_fx_node_fix("executorch")
def _fix_fft_cross_correlation_as_real_sum(graph_module, node) -> bool:
    """Autoformer finds its periods by the cross-correlation theorem, ``irfft(rfft(q) * conj(rfft(k)))``: complex
    tensors, which to_edge refuses ("_conj_copy does not support automatic differentiation"). The same circular
    correlation, ``out[tau] = sum_t q[(t + tau) mod n] * k[t]``, is a gather from q laid twice end to end, a product
    and a sum: real ops, n² terms for a window of n."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    aten = torch.ops.aten
    if node.op != "call_function" or node.target is not aten.fft_irfft.default:
        return False
    product, n, dim, norm = _fft_arguments(node)
    if n is None or norm is not None or getattr(product, "target", None) is not aten.mul.Tensor:
        return False
    conjugated = [factor for factor in product.args if getattr(factor, "target", None) in _CONJUGATES]
    if len(conjugated) != 1 or len(product.args) != 2:
        return False
    spectra = (next(factor for factor in product.args if factor is not conjugated[0]), conjugated[0].args[0])
    if not all(getattr(spectrum, "target", None) is aten.fft_rfft.default for spectrum in spectra):
        return False
    (shifted, *rest), (fixed, *rest_fixed) = (_fft_arguments(spectrum) for spectrum in spectra)
    if rest != [n, dim, None] or rest_fixed != [n, dim, None]:
        return False
    length = n.meta["val"] if isinstance(n, torch.fx.Node) else n
    dim %= shifted.meta["val"].dim()
    if not all(statically_known_true(source.meta["val"].shape[dim] == length) for source in (shifted, fixed)):
        return False  # rfft would pad or cut: not this sum

    graph = graph_module.graph
    call = functools.partial(_call, graph)
    # in the program's fake mode: `arange` has no tensor argument to take it from
    with graph.inserting_before(node), shifted.meta["val"].fake_mode:
        positions = call(aten.arange.default, n)
        lags_and_times = call(
            aten.add.Tensor, call(aten.unsqueeze.default, positions, 1), call(aten.unsqueeze.default, positions, 0)
        )
        doubled = call(aten.cat.default, [shifted, shifted], dim)
        gathered = call(aten.index_select.default, doubled, dim, call(aten.view.default, lags_and_times, [-1]))
        lagged = call(aten.unflatten.int, gathered, dim, [n, n])  # (..., lag, time, ...)
        terms = call(aten.mul.Tensor, lagged, call(aten.unsqueeze.default, fixed, dim))
        correlation = call(aten.sum.dim_IntList, terms, [dim + 1])
    node.replace_all_uses_with(correlation)
    graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_certain_bernoulli(graph_module, node) -> bool:
    """`bernoulli` is not in the Core ATen opset. With a probability of 0 or 1 it draws nothing at random: zeros or
    ones (SpeechT5's decoder prenet keeps its dropout in eval mode, with p = 0 here)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.bernoulli.p:
        return False
    source, probability = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    if probability not in (0, 1):
        return False
    fill = torch.ops.aten.ones_like.default if probability == 1 else torch.ops.aten.zeros_like.default
    node.target, node.args, node.kwargs = fill, (source,), {}
    return True


def _scaled_by_zero(node) -> bool:
    """Whether every use of ``node`` is a product by 0, or a product whose every use is."""
    products = (torch.ops.aten.mul.Tensor, torch.ops.aten.mul.Scalar)
    for user in node.users:
        if user.target not in products:
            return False
        factor = user.args[1] if user.args[0] is node else user.args[0]
        if not (isinstance(factor, (int, float)) and factor == 0) and not _scaled_by_zero(user):
            return False
    return bool(node.users)


@register_fx_node_fix("executorch")
def _fix_noise_scaled_by_zero(graph_module, node) -> bool:
    """The runtime draws nothing at random ("randn_like is not in Core ATen"). Noise whose scale is 0 (VITS with
    `noise_scale=0`, as the sweep runs it to compare with eager) is multiplied away: zeros give the same numbers,
    the infinities and NaNs of the other factors included."""
    aten = torch.ops.aten
    zeros = {aten.randn.default: aten.zeros.default, aten.randn_like.default: aten.zeros_like.default}
    if node.op != "call_function" or node.target not in zeros or not _scaled_by_zero(node):
        return False
    node.target = zeros[node.target]  # same arguments: the size or the tensor, then dtype, layout, device
    return True


# integer dtypes whose values, times a sort's length, fit in int64
_NARROW_INTEGERS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32)


@register_fx_node_fix("executorch")
def _fix_sort_as_topk(graph_module, node) -> bool:
    """The runtime has no sort kernel, so a program that sorts fails to load ("OperatorMissing"; ViTMAE's random
    masking argsorts its noise, SAM-HQ sorts its point scores). Sorting is a top-k of every element along the
    axis, which the runtime has; an argsort is that top-k's indices. The top-k orders equal values its own way
    where eager's sort keeps them in place (PP-DocLayoutV2 argsorts a 0/1 mask to put its kept boxes first, and
    its boxes came out shuffled): small integers are ranked by a key with their position as the tie-break."""
    aten = torch.ops.aten
    sorts = {aten.sort.default: False, aten.sort.stable: False, aten.argsort.default: True, aten.argsort.stable: True}
    if node.op != "call_function" or node.target not in sorts:
        return False
    positional = node.args[1:] if node.target in (aten.sort.default, aten.argsort.default) else ()
    arguments = {**dict(zip(("dim", "descending"), positional)), **node.kwargs}
    source, dim, descending = node.args[0], arguments.get("dim", -1), bool(arguments.get("descending", False))
    graph = graph_module.graph
    length = source.meta["val"].shape[dim]
    key = source
    if isinstance(length, int) and source.meta["val"].dtype in _NARROW_INTEGERS:
        with graph.inserting_before(node):
            key = _ranked_with_position_tie_break(graph, source, dim, length, descending)
    elif not isinstance(length, int):  # a symbolic length: read from the tensor at run time
        length = _call_after(graph, source, aten.sym_size.int, dim % source.meta["val"].dim())
    topk = _call_after(graph, key, aten.topk.default, length, dim, descending, True, after=node.prev)
    indices = _call_after(graph, topk, operator.getitem, 1)
    if sorts[node.target]:
        node.replace_all_uses_with(indices)
    else:  # the values are the source's, whatever the key
        values = _call_after(graph, source, aten.gather.default, dim, indices, after=indices)
        for user in list(node.users):
            user.replace_all_uses_with(values if user.args[1] == 0 else indices)
            graph.erase_node(user)
    graph.erase_node(node)
    return True


def _ranked_with_position_tie_break(graph, source, dim, length, descending):
    """``source * (length + 1) -/+ position``: the order of ``source``, and among equal values the first first."""
    aten = torch.ops.aten
    wide = _call(graph, aten._to_copy.default, source, dtype=torch.int64)
    positions = _call(graph, aten.cumsum.default, _call(graph, aten.ones_like.default, wide), dim)
    scaled = _call(graph, aten.mul.Scalar, wide, length + 1)
    return _call(graph, aten.sub.Tensor if descending else aten.add.Tensor, scaled, positions)


@register_fx_node_fix("executorch")
def _fix_empty_of_symbolic_size(graph_module, node) -> bool:
    """ExecuTorch's memory-format pass turns `empty` into `dim_order_ops._empty_dim_order`, whose size is `int[]`,
    not `SymInt[]`: converting a dynamic size to int pins it (DeepSeek-V2's MLA `new_empty` pinned batch and
    length). Its contents are undefined anyway, so zeros serve: `new_zeros`/`zeros` keep their sizes symbolic."""
    aten = torch.ops.aten
    replacements = {aten.new_empty.default: aten.new_zeros.default, aten.empty.memory_format: aten.zeros.default}
    if node.op != "call_function" or node.target not in replacements:
        return False
    size = node.args[1] if node.target is aten.new_empty.default else node.args[0]
    if not any(isinstance(dim, (torch.fx.Node, torch.SymInt)) for dim in size):
        return False
    node.target = replacements[node.target]
    node.kwargs = {key: value for key, value in node.kwargs.items() if key != "memory_format"}
    return True


@register_fx_node_fix("executorch")
def _fix_tensor_condition_assert(graph_module, node) -> bool:
    """A check on a tensor condition (`torch._check_tensor_all`: vision-language models compare their image-token
    count with their feature count) traces as `item(_is_all_true(c))` turned into an integer by `sym_ite` and
    asserted equal to 1. ExecuTorch evaluates `sym_ite` in Python while lowering, where the value is unknown, and
    fails on the guard. The assert is dropped from the program: it only rejects malformed inputs, and ExecuTorch
    has no runtime assert to carry it."""
    if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
        return False
    conversions = [arg for arg in getattr(node.args[0], "args", ()) if getattr(arg, "target", None) is torch.sym_ite]
    if not any(_is_tensor_truth(conversion.args[0]) for conversion in conversions):
        return False
    graph_module.graph.erase_node(node)
    return True


@register_fx_node_fix("executorch")
def _fix_size_only_check(graph_module, node) -> bool:
    """A tensor computed only to assert on its length: T5's classification head checks that every example has as
    many EOS tokens with `len(unique_consecutive(counts)) == 1`. `unique_consecutive` is not in Core ATen, so
    to_edge rejects a program that only needs it for that check. The assert is dropped (it only rejects malformed
    inputs), and the tensor with it."""
    if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    # walk the symbolic arithmetic of the condition back to the lengths it reads; any tensor value there is data
    sizes, pending, seen = [], [node.args[0]], set()
    while pending:
        current = pending.pop()
        if not isinstance(current, torch.fx.Node) or current in seen:
            continue
        seen.add(current)
        if current.target is torch.ops.aten.sym_size.int:
            sizes.append(current)
        elif isinstance(current.meta.get("val"), torch.Tensor):
            return False
        else:
            pending.extend(current.all_input_nodes)
    # only a data-dependent length, of a tensor nothing else reads
    if not sizes or not all(free_unbacked_symbols(size.meta.get("val")) for size in sizes):
        return False
    if any(user.target is not torch.ops.aten.sym_size.int for size in sizes for user in size.args[0].users):
        return False
    graph_module.graph.erase_node(node)
    return True


def _is_tensor_truth(node) -> bool:
    """``node`` is ``item(_is_all_true(tensor))``."""
    return (
        getattr(node, "target", None) is torch.ops.aten.item.default
        and getattr(node.args[0], "target", None) is torch.ops.aten._is_all_true.default
    )
