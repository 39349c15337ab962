"""DynamoExporter: a transformers model to a ``torch.export`` ``ExportedProgram``.

``trace_model`` is the part the ONNX and ExecuTorch exporters share; it runs these stages in order:

1. forward signature: ``model.forward`` takes exactly the traced inputs, by name; the rest are baked in as
   constants, and so are inputs whose values the model reads as sizes (``SIZE_INPUTS``) in a static export;
2. model patches: ``@register_patch("dynamo", ...)``, and packed-sequence attention as one masked SDPA;
3. pytree registration: every ``Cache`` (and model-local ``*Cache``) type flattens to its tensors and rebuilds;
4. dynamic shapes: ``Dim.AUTO`` on every axis of every input tensor and cache leaf, or ``config.dynamic_shapes``;
5. state cleanup: tensor attributes a model caches in ``forward`` (``_STATEFUL_CACHE_ATTRS``) are emptied for the
   trace and restored after it, so neither stale eager state nor fake tensors cross the trace; buffers read as
   Python numbers (``_BUFFERS_READ_AS_NUMBERS``) are those numbers for the trace.

Then ``torch.export.export`` traces the model.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import math
import statistics
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree

from .exported import Exported, build_metadata
from .utils import (
    DynamoExportError,
    StageLog,
    applied_reporter,
    apply_patches,
    named_leaves,
    register_patch,
    report_applied,
    spec_leaf_names,
    split_inputs,
)


@dataclass
class DynamoConfig:
    dynamic: bool = False
    # Overrides the automatic Dim.AUTO shapes: {input name: spec}, as torch.export takes it.
    dynamic_shapes: Any = None
    strict: bool = False


class DynamoExported(Exported):
    backend = "dynamo"
    program_file = "model.pt2"

    def __init__(self, program, metadata):
        super().__init__(program, metadata)
        self._module = None

    def _runtime(self):
        if self._module is None:
            module = self.program.module()
            # Return the flat leaves as traced: rebuilding caches and flattening them again would drop a leaf the
            # dynamic trace turned into a number (a sliding window's position counter).
            module._out_spec = _pytree.tree_structure(tuple(range(module._out_spec.num_leaves)))
            self._module = module
        return self._module

    def _run(self, feed):
        args, kwargs = _pytree.tree_unflatten(feed, self.program.call_spec.in_spec)
        with torch.no_grad():
            return list(self._runtime()(*args, **kwargs))

    def _save_program(self, path: Path) -> None:
        torch.export.save(self.program, str(path))

    @classmethod
    def _load(cls, directory, metadata):
        register_pytree_nodes()
        return cls(torch.export.load(str(directory / cls.program_file)), metadata)


class DynamoExporter:
    """``DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))`` -> a callable ``DynamoExported``."""

    def export(self, model: torch.nn.Module, inputs: dict[str, Any], config: DynamoConfig | None = None) -> DynamoExported:
        config = config or DynamoConfig()
        log = StageLog(DynamoExportError)
        traced = trace_model(model, inputs, config, log)
        metadata = build_metadata("dynamo", model, traced, config, log)
        return DynamoExported(traced.program, metadata)


@dataclass
class Traced:
    program: torch.export.ExportedProgram
    input_names: list[str]
    output_names: list[str]
    constants: dict[str, Any]

    def input_shapes(self) -> dict[str, list]:
        """Each traced input's shape as the program accepts it: a number where the trace fixed the axis, the
        symbol's name (``s27``) where it stayed dynamic."""
        user_inputs = set(self.program.graph_signature.user_inputs)
        placeholders = [node for node in self.program.graph.nodes if node.op == "placeholder" and node.name in user_inputs]
        return {
            name: [_size_or_symbol(size) for size in node.meta["val"].shape]
            for name, node in zip(self.input_names, placeholders)
            if hasattr(node.meta.get("val"), "shape")
        }

    def object_states(self) -> dict[str, str]:
        """The non-tensor state (lengths, flags) of each input object flattened by this module's pytree nodes (a
        cache's), as the JSON the trace kept: the program computed with these values and no input carries them."""
        kwargs_spec = self.program.call_spec.in_spec.child(1)
        return {name: spec.context for name, spec in zip(kwargs_spec.context, kwargs_spec.children())
                if isinstance(spec.context, str) and _pytree.SUPPORTED_NODES[spec.type].flatten_fn is _flatten}


def object_state_difference(value: Any, baked: str) -> str | None:
    """Where ``value``'s non-tensor state differs from the ``baked`` one (``layers.0.cumulative_length: 5, exported
    with 7``), or None."""
    node = _pytree.SUPPORTED_NODES.get(type(value))
    if node is None or node.flatten_fn is not _flatten:
        return f"a {type(value).__name__}, exported with another type"
    return _first_difference(json.loads(_flatten(value)[1]), json.loads(baked), "")


def _first_difference(here: Any, there: Any, path: str) -> str | None:
    if here == there:
        return None
    if type(here) is list and type(there) is list and len(here) == len(there):
        pairs = [(f"{path}.{i}", a, b) for i, (a, b) in enumerate(zip(here, there))]
    elif all(isinstance(node, dict) and node.get(_TAG) == "object" for node in (here, there)) and (
        here["class"] == there["class"] and here["state"].keys() == there["state"].keys()
    ):
        pairs = [(f"{path}.{key}", here["state"][key], there["state"][key]) for key in here["state"]]
    else:
        return f"{path.lstrip('.') or 'its structure'}: {here!r}, exported with {there!r}"
    return next(filter(None, (_first_difference(a, b, where) for where, a, b in pairs)), None)


def _size_or_symbol(size) -> int | str:
    # a symbol a later guard pinned to one value prints as that value
    text = str(size)
    return int(text) if text.isdigit() else text


def trace_model(model: torch.nn.Module, inputs: dict[str, Any], config: DynamoConfig, log: StageLog) -> Traced:
    """Run stages 1 to 5 around ``torch.export.export``; every failure names its stage."""
    traced_inputs, constants = split_inputs(inputs, sizes_as_constants=not config.dynamic)
    # an input that is a view would have its base traced and guarded too, a tensor no caller of the program passes
    traced_inputs = {name: value.clone() if isinstance(value, torch.Tensor) and value._base is not None else value
                     for name, value in traced_inputs.items()}
    size_dtypes = {name: inputs[name].dtype for name in constants if isinstance(inputs[name], torch.Tensor)}
    fired: set[str] = {"size_inputs_as_constants"} if size_dtypes else set()
    with ExitStack() as active, torch.no_grad():
        with log.stage("signature"):
            active.enter_context(flat_forward(model, list(traced_inputs), constants, size_dtypes, not config.dynamic))
        with log.stage("model-patches"):
            active.enter_context(apply_patches("dynamo", fired))
            active.enter_context(segmented_attention(model, fired))
        with log.stage("pytree"):
            register_pytree_nodes(model)
        with log.stage("dynamic-shapes"):
            dynamic_shapes = config.dynamic_shapes
            if dynamic_shapes is None and config.dynamic:
                dynamic_shapes = {name: auto_dynamic_shapes(value) for name, value in traced_inputs.items()}
        with log.stage("state-cleanup"):
            active.enter_context(cleared_model_state(model))
        try:
            with log.stage("torch-export"):
                program = torch.export.export(
                    model, (), kwargs=dict(traced_inputs), dynamic_shapes=dynamic_shapes, strict=config.strict
                )
        finally:
            log.note(sorted(fired))
    # The in_spec is ((), {kwargs}): drop the leading args/kwargs index from each name.
    input_names = [name.split(".", 1)[1] for name in spec_leaf_names(program.call_spec.in_spec)]
    output_names = spec_leaf_names(program.call_spec.out_spec)
    return Traced(program, input_names, output_names, constants)


# ── Stage 1: Forward signature ───────────────────────────────────────────────
# transformers forwards end in `**kwargs`; torch.export folds every keyword into that one bundle and then cannot
# match `dynamic_shapes` by name. A forward with exactly the traced names avoids it; constants (flags like
# `use_cache=False`) are bound inside instead of becoming program inputs.


_SIZE_NUMEL_LIMIT = 4096  # image grids, the per-image sizes computed from them, feature map sizes


@contextmanager
def flat_forward(model: torch.nn.Module, names: list[str], constants: dict[str, Any], size_dtypes=None,
                 static: bool = False):
    """``model.forward`` taking the traced inputs by name, the constants bound; size inputs baked as constants
    (``size_dtypes``: their dtypes) reach the model as the tensors it expects, made during the trace, whose values
    the trace keeps: their ``tolist()`` gives numbers, not data-dependent sizes. A ``static`` trace keeps the values
    of every small tensor the forward builds from numbers (SAM 3's feature map sizes, which its decoder reads)."""
    import torch._subclasses.fake_tensor as fake_tensor

    had_own = "forward" in vars(model)
    original = model.forward
    size_dtypes = size_dtypes or {}

    def forward(*args, **kwargs):
        kwargs.update(zip(names, args))
        sizes = {name: torch.tensor(constants[name], dtype=dtype) for name, dtype in size_dtypes.items()}
        # Looked up at call time: a stage 2 patch may replace the class's own forward.
        call = original if had_own else type(model).forward.__get__(model)
        return call(**kwargs, **{**constants, **sizes})

    # the trace keeps values only of tensors this small, and of what is computed from them alone (1 by default)
    numel_limit = fake_tensor.CONSTANT_NUMEL_LIMIT
    if static:
        fake_tensor.CONSTANT_NUMEL_LIMIT = max(numel_limit, _SIZE_NUMEL_LIMIT)

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names]
    )
    model.forward = forward
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = numel_limit
        if had_own:
            model.forward = original
        else:
            del model.forward


# ── Stage 2: Model patches ───────────────────────────────────────────────────
# `@register_patch("dynamo", path)` factories, installed for the trace by `apply_patches("dynamo")`. The ONNX and
# ExecuTorch exporters trace through this stage too, so a fix here serves all three backends.


@register_patch("dynamo", "torch.nn.Module.to", reports=True)
def _patch_module_cast_to_its_own_dtype(original):
    """MoE routers cast their classifier in forward (`self.classifier = self.classifier.to(self.dtype)`: Switch
    Transformers, NLLB-MoE). Under export `Module._apply` cannot swap the traced weights ("Couldn't swap"); a cast
    to the dtype and device every weight already has changes nothing, so it is the module itself."""

    def to(self, *args, **kwargs):
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        unchanged = memory_format is None and all(
            (dtype is None or tensor.dtype == dtype or not tensor.is_floating_point())
            and (device is None or tensor.device == device)
            for tensor in (*self.parameters(), *self.buffers())
        )
        if not unchanged:
            return original(self, *args, **kwargs)
        report_applied()
        return self

    return to


@register_patch("dynamo", "torch._prims_common.is_contiguous", reports=True)
def _patch_contiguity_asked_without_guards(original):
    """Tracing records whether each result is contiguous, asking torch's "false when unsure" contiguity test. That
    test still guards on a symbolic size whose example is 0, 1 or 2 (too few elements to matter, a dimension of one
    to skip): DeepSeek V4 keeps the `length % 4` tokens past its last window, an example of one token when a prompt
    of 7 is traced, and the program then refused a prompt of 5; HunYuan-VL's `images - 1` fixed the image count at
    2 in ExecuTorch's re-trace (pytorch/pytorch#165032). Unsure stays false here without a guard: a size is skipped
    or counted small only when it is so for every size the program takes."""
    from torch.fx.experimental.symbolic_shapes import is_nested_int, statically_known_true

    def is_contiguous(a, false_if_dde=False):
        symbolic = [size for size in a.shape if isinstance(size, torch.SymInt)]
        if not false_if_dde or not symbolic or any(is_nested_int(size) for size in symbolic):
            return original(a, false_if_dde)
        report_applied()
        if statically_known_true(a.numel() < 2):
            return True
        # a contiguous stride is the product of the sizes after it, as torch writes it with or without Max(1, size)
        product, product_of_nonzero = 1, 1
        for size, stride in reversed(tuple(zip(a.shape, a.stride()))):
            if statically_known_true(size == 1):
                continue
            if not (statically_known_true(stride == product) or statically_known_true(stride == product_of_nonzero)):
                return False
            product, product_of_nonzero = product * size, product_of_nonzero * torch.sym_max(size, 1)
        return True

    return is_contiguous


@register_patch("dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface", reports=True)
def _patch_experts_batched_mm(original):
    """Mixture-of-experts layers default to `grouped_mm`, which on CPU is a custom op (`transformers::
    grouped_mm_fallback`) that neither ONNX nor ExecuTorch can lower, fed by `torch.histc` counts ExecuTorch has
    no kernel for; the `eager` one some models ask for (OpenAI Privacy Filter) loops over the experts a batch hits
    (`nonzero()`), which export cannot trace, and so does a layer whose config names none (Diffusion Gemma's decoder
    builds its layers from a sub-config that is never dispatched). The `batched_mm` implementation computes the same
    sum with plain batched matmuls."""

    def get_interface(self, experts_implementation, default):
        if experts_implementation in ("grouped_mm", "eager", None):
            experts_implementation = "batched_mm"
            report_applied()
        return original(self, experts_implementation, default)

    return get_interface


@register_patch(
    "dynamo",
    *(f"transformers.models.{name}.modeling_{name}.len"
      for name in ("rt_detr", "rt_detr_v2", "d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "depth_pro",
                   "clipseg", "qwen2_5_omni", "radio", "omdet_turbo")),
    reports=True,
)
def _patch_len_of_tensor_symbolic(original):
    """RT-DETR and the detectors built on its code (OmDet-Turbo's decoder too) read their batch size as
    `len(source_flatten)`, DepthPro counts its patches per scale so, CLIPSeg its prompts, Qwen2.5-Omni's vocoder its
    utterances, RADIO its packed images.
    Python's `len` must answer an int, so a dynamic batch is fixed to the traced one; in these modules the length of
    a tensor is its first size, which stays symbolic."""

    def length(value):
        if not isinstance(value, torch.Tensor) or not value.dim():
            return original(value)
        if isinstance(value.shape[0], torch.SymInt):  # a fixed size is what `len` answers anyway
            report_applied()
        return value.shape[0]

    return length


@register_patch("dynamo", "torch.take_along_dim", "torch.Tensor.take_along_dim", reports=True)
def _patch_take_along_dim_as_gather(original):
    """`take_along_dim` traces through a decomposition that broadcasts its operands by comparing their sizes, which
    fixes every symbolic axis to its traced size (PP-DocLayout V2 ranks its queries so: the batch was fixed). With
    operands of one shape but along `dim`, it is `gather` along `dim`: the same values."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    def take_along_dim(input, indices, dim=None):
        same_shape = dim is not None and input.dim() == indices.dim() and all(
            axis == dim % input.dim() or statically_known_true(size == other)
            for axis, (size, other) in enumerate(zip(input.shape, indices.shape)))  # fmt: skip
        if not same_shape or not any(isinstance(size, torch.SymInt) for size in input.shape):
            return original(input, indices, dim)
        report_applied()
        return torch.gather(input, dim, indices)

    return take_along_dim


@register_patch("dynamo", "transformers.models.esm.modeling_esmfold.range", reports=True)
def _patch_range_of_symbolic_batch_as_arange(original):
    """ESMFold marks each sequence's end with `esmaa[range(B), ends] = eos`: Python's `range` takes an int, which
    fixes a dynamic batch to the traced one. As an index, `arange(B)` selects the same rows and keeps B symbolic."""

    def symbolic_range(*args):
        if len(args) != 1 or not isinstance(args[0], torch.SymInt):
            return original(*args)
        report_applied()
        return torch.arange(args[0])

    return symbolic_range


@register_patch("dynamo", "transformers.models.encodec.modeling_encodec.range", reports=True)
def _patch_encodec_one_chunk_as_one_offset(original):
    """Without a chunk length, Encodec encodes its whole input as one chunk, listed as `range(0, length, length)`:
    Python's `range` takes ints, which fixes a symbolic length. That range is the one offset 0."""

    def chunk_offsets(*args):
        if len(args) == 3 and isinstance(args[1], torch.SymInt) and args[0] == 0 and args[2] is args[1]:
            report_applied()
            return [0]
        return original(*args)

    return chunk_offsets


@register_patch("dynamo", "transformers.models.nemotron3_diarization.modeling_nemotron3_diarization.range",
                "transformers.models.nemotron3_5_transcribe.modeling_nemotron3_5_transcribe.range", reports=True)
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


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.forward"
                            for module, model in _TIMESFM), reports=True)
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


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}._preprocess"
                            for module, model in _TIMESFM))
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


@register_patch("dynamo", "transformers.models.blt.modeling_blt.byte_group_hash_function")
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


@register_patch("dynamo", "transformers.models.vits.modeling_vits.VitsAttention._get_relative_embeddings", reports=True)
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


@register_patch("dynamo", "transformers.cache_utils.LinearAttentionLayer.update_conv_state", reports=True)
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


class _WholeSplit:
    """Per-image sizes read from a tensor of symbolic length: a split by them is taken whole, and code that knows this
    marker reads the sizes from `tensor`."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __iter__(self):
        raise TypeError("per-image sizes were kept symbolic for the export; only a split or a patch can take them")


@contextmanager
def _split_taken_whole(caller):
    """While it lasts, ``tensor.tolist()`` called by ``caller``'s own code on a tensor of symbolic length gives a
    `_WholeSplit`, and a split by it gives the tensor whole, as a one-part tuple."""
    from torch._subclasses.fake_tensor import FakeTensor  # the trace's tensors, with a `tolist` of their own

    caller_code = inspect.unwrap(caller).__code__
    own_tolists = {cls: vars(cls).get("tolist") for cls in (torch.Tensor, FakeTensor)}  # None: inherited
    tolist_of = {cls: cls.tolist for cls in own_tolists}
    split = torch.Tensor.split

    def deferred_tolist(self):
        if sys._getframe(1).f_code is caller_code and self.dim() and isinstance(self.shape[0], torch.SymInt):
            report_applied()
            return _WholeSplit(self)
        return tolist_of[FakeTensor if isinstance(self, FakeTensor) else torch.Tensor](self)

    def whole_split(self, split_size, dim=0):
        return (self,) if isinstance(split_size, _WholeSplit) else split(self, split_size, dim)

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


@register_patch("dynamo", "torch.nn.ModuleList.__getitem__", reports=True)
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


@register_patch("dynamo", "transformers.models.csm.modeling_csm.CsmCodebooksHead.forward", reports=True)
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


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask",
                reports=True)
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
    "dynamo",
    "transformers.models.moonshine.modeling_moonshine.MoonshinePreTrainedModel._get_feat_extract_output_lengths",
    reports=True,
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


@register_patch("dynamo", "transformers.models.neucodec.modeling_neucodec.NeuCodecModel.forward", reports=True)
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


@register_patch("dynamo", "transformers.models.xcodec.modeling_xcodec.conv1d_output_length", reports=True)
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


@register_patch("dynamo", "transformers.models.musicflamingo.modeling_musicflamingo.MusicFlamingoModel"
                "._build_audio_timestamps", reports=True)
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


@register_patch("dynamo", "torch.nn.utils.rnn.pad_sequence", reports=True)
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


@register_patch("dynamo", "transformers.modeling_utils.AttentionInterface.get_interface", reports=True)
def _patch_sdpa_skips_a_future_only_mask_as_eager_does(original):
    """Without padding, eager drops the causal mask and SDPA follows the attention module's own `is_causal`. Models
    whose modules are not causal but whose masks are (ColPali's PaliGemma, Aimv2's text tower) then attend
    everywhere in eager; under export the mask cannot be checked for padding, so it is kept and the program attends
    causally. For such a module, a mask that hides the future and nothing else is read as no mask, chosen inside the
    program: eager's numbers, with padding or without."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    as_eager_reads = {}  # one reading per mask: every layer gets the same mask object

    def sdpa_like_eager(report, module, query, key, value, attention_mask, *args, **kwargs):
        # causal if the caller says so (OmDet-Turbo's text encoder) or the module's own flag does: an `is_causal=False`
        # argument is often derived from the mask being there (Moonshine's decoder), which eager drops and the trace
        # keeps
        module_is_causal = kwargs.get("is_causal") or getattr(module, "is_causal", True)
        square = attention_mask is not None and attention_mask.dtype == torch.bool and query.shape[2] == key.shape[2]
        if module_is_causal or not square or attention_mask.shape[-2] != attention_mask.shape[-1]:
            return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
        report()
        if id(attention_mask) not in as_eager_reads:
            future_hidden = torch.ones(attention_mask.shape[-2:], dtype=torch.bool, device=attention_mask.device)
            only_future = (attention_mask == future_hidden.tril()).all()
            as_eager_reads[id(attention_mask)] = (attention_mask, attention_mask | only_future)  # keeps the id's owner
        return sdpa_attention_forward(module, query, key, value, as_eager_reads[id(attention_mask)][1], *args, **kwargs)

    def get_interface(self, attn_implementation, default):
        found = original(self, attn_implementation, default)
        if found is not sdpa_attention_forward:
            return found
        return functools.partial(sdpa_like_eager, applied_reporter())  # it runs after this call returns

    return get_interface


@register_patch("dynamo", "transformers.modeling_utils.AttentionInterface.get_interface", reports=True)
def _patch_sdpa_on_queries_counted_from_data(original):
    """transformers' SDPA first asks `query length > 1` to pick the causal kernel. When that length was counted from
    data (VideoMAE pre-training encodes only the patches its mask leaves visible) the question has no answer in the
    trace, nor has the kernel's own check for an empty query. A module that is not causal needs neither: it gets
    SDPA's arithmetic written out, which asks nothing about the length."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from transformers.integrations.sdpa_attention import repeat_kv

    def sdpa_not_asking_the_length(report, found, module, query, key, value, attention_mask, *args, **kwargs):
        causal = kwargs.get("is_causal") or getattr(module, "is_causal", True)
        extras = args or any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap"))
        if causal or extras or not free_unbacked_symbols(query.shape[2]):
            return found(module, query, key, value, attention_mask, *args, **kwargs)
        report()
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        scores = query @ key.transpose(-1, -2) * (kwargs.get("scaling") or query.shape[-1] ** -0.5)
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        elif attention_mask is not None:
            scores = scores + attention_mask
        weights = torch.nn.functional.dropout(scores.softmax(-1), kwargs.get("dropout", 0.0), module.training)
        return (weights @ value).transpose(1, 2).contiguous(), None

    def get_interface(self, attn_implementation, default):
        found = original(self, attn_implementation, default)
        if attn_implementation != "sdpa":
            return found
        return functools.partial(sdpa_not_asking_the_length, applied_reporter(), found)

    return get_interface


@register_patch("dynamo", "transformers.models.phi4_multimodal.modeling_phi4_multimodal.create_bidirectional_mask",
                reports=True)
def _patch_phi4_vision_mask_causal_when_it_hides_nothing(original):
    """Phi-4-multimodal's vision attention modules are flagged causal. Eager drops a padding mask that hides
    nothing, and SDPA then follows the flag: the patches attend causally. Under export the mask cannot be checked,
    so it is kept and the program attends everywhere (its last hidden state 3.3 off eager's). Inside the program a
    mask that hides nothing becomes the causal one (see `_patch_sdpa_skips_a_future_only_mask_as_eager_does` for
    the converse): eager's numbers, with padding or without."""

    def create_bidirectional_mask(config, inputs_embeds, attention_mask, *args, **kwargs):
        mask = original(config, inputs_embeds, attention_mask, *args, **kwargs)
        if attention_mask is None or not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return mask
        report_applied()
        causal = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()
        return mask & (causal | ~attention_mask.bool().all())

    return create_bidirectional_mask


@register_patch("dynamo", "transformers.masking_utils._vmap_expansion_sdpa")
def _patch_mask_by_broadcast(_original):
    """A mask with a custom overlay (Gemma 3's bidirectional image blocks) is built with `torch.vmap`, which traces,
    but leaves batching ops that torch.onnx and ExecuTorch's decompositions reject ("tensor may have escaped from
    inside a function being vmapped"). transformers' overlays index their inputs by position tensors, so the
    broadcast expansion its default masks use builds the same mask without vmap."""
    from transformers.masking_utils import _non_vmap_expansion_sdpa

    def expansion(mask_function):
        def expanded(batch, head, query, key):
            mask = mask_function(*_non_vmap_expansion_sdpa(batch, head, query, key))
            return mask.expand(batch.shape[0], head.shape[0], query.shape[0], key.shape[0])

        return expanded

    return expansion


@register_patch("dynamo", "transformers.masking_utils._ignore_bidirectional_mask_sdpa", reports=True)
def _patch_no_padding_means_no_mask(original):
    """Without a padding mask, eager attends everywhere with no mask at all, but under export transformers builds
    one anyway (it skips only after checking a mask's values, which export cannot do). That mask is sized for the
    input: encoders that shorten their sequence between layers (Informer's and Autoformer's distilling
    convolutions) then meet a mask of the wrong size. With nothing to check, the export skips it like eager."""

    def ignore(padding_mask, kv_length, local_attention_size=None):
        if padding_mask is None and (local_attention_size is None or kv_length < local_attention_size):
            report_applied()
            return True
        return original(padding_mask, kv_length, local_attention_size)

    return ignore


def _every_expert(hidden_states, chosen, weights, experts):
    """Mixture-of-experts layers loop over the experts a batch hits (`nonzero()`), a data-dependent loop
    torch.export cannot trace. Every expert runs on every token instead, weighted by its routing weight (zero where
    not chosen): the same sum. ``experts[i](hidden_states)`` is expert ``i``'s output; ``chosen`` holds expert
    indices, ``weights`` their routing weights, in the same layout."""
    output = torch.zeros_like(hidden_states)
    for index, expert in enumerate(experts):
        weight = ((chosen == index).to(weights.dtype) * weights).sum(dim=-1, keepdim=True)
        output = output + (expert(hidden_states) * weight).to(hidden_states.dtype)
    return output


@register_patch("dynamo", "transformers.models.nllb_moe.modeling_nllb_moe.NllbMoeExperts.forward")
def _patch_nllb_moe_experts_dense(_original):
    """NLLB-MoE's experts, every one on every token (`_every_expert`), with eval mode's token-dropout scaling."""

    def forward(self, hidden_states, router_mask, router_probs):
        scale = 1 - self.moe_token_dropout if self.moe_token_dropout > 0 and not self.training else 1.0
        experts = [lambda x, i=i: self[f"expert_{i}"](x) * scale for i in range(self.num_experts)]
        return _every_expert(hidden_states, router_mask, router_probs, experts)

    return forward


@register_patch(
    "dynamo", "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts.forward"
)
def _patch_switch_transformers_experts_dense(_original):
    """Switch Transformers' experts, every one on every token (`_every_expert`). Its router hands over a one-hot
    expert mask per token (all zeros past an expert's capacity) and one routing weight per token."""

    def forward(self, hidden_states, selected_experts, routing_weights):
        mask = selected_experts[:, 0, :].to(routing_weights.dtype)
        chosen = torch.arange(self.num_experts, device=mask.device).expand_as(mask)
        experts = [self[f"expert_{index}"] for index in range(self.num_experts)]
        return _every_expert(hidden_states, chosen, mask * routing_weights, experts)

    return forward


@register_patch("dynamo", "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward")
def _patch_longcat_flash_experts_dense(_original):
    """LongCat-Flash's experts, every one on every token (`_every_expert`); its zero-compute experts pass the
    tokens through, as in eager."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def routed(index):
            def expert(x):
                gate, up = torch.nn.functional.linear(x, self.gate_up_proj[index]).chunk(2, dim=-1)
                return torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[index])

            return expert

        experts = [
            self.identity_expert if index >= self.num_routed_experts or self.gate_up_proj is None else routed(index)
            for index in range(self.total_experts)
        ]
        return _every_expert(hidden_states, top_k_index, top_k_weights, experts)

    return forward


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward")
def _patch_step3p7_experts_dense(_original):
    """Step 3.7's experts, every one on every token (`_every_expert`), with their clamped gates; the index one past
    the last expert, which eager skips, matches none."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        def routed(index):
            def expert(x):
                gate_up = torch.nn.functional.linear(x, self.gate_up_proj[index])
                return torch.nn.functional.linear(self._apply_gate(gate_up), self.down_proj[index])

            return expert

        return _every_expert(hidden_states, top_k_index, top_k_weights, [routed(i) for i in range(self.num_experts)])

    return forward


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7VisionModel.forward")
def _patch_step3p7_positions_from_the_grid(_original):
    """Step 3.7's tower writes its patch grid into a tensor and reads it back (`tolist`) to lay out its rotary
    positions: under export the sizes read back are data-dependent, unrelated to the image's, and ExecuTorch plans
    the positions for the product of their bounds (2**36 elements, "bad number ... for type int32").
    The positions laid out from the grid's own sizes (row-major: one image, merge size 1); the rest is eager's."""
    from transformers.modeling_outputs import BaseModelOutput
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, **kwargs):
        batch, _, height, width = pixel_values.shape
        rows, columns = height // self.embeddings.patch_size, width // self.embeddings.patch_size
        hidden_state = self.pre_layernorm(self.embeddings(pixel_values, interpolate_pos_encoding=True))
        row, column = torch.meshgrid(torch.arange(rows, device=hidden_state.device),
                                     torch.arange(columns, device=hidden_state.device), indexing="ij")
        position_embeddings = self.rotary_emb(hidden_state, torch.stack([row.flatten(), column.flatten()], dim=-1))
        for layer in self.layers:
            hidden_state = layer(hidden_state, position_embeddings=position_embeddings, **kwargs)
        hidden_state = hidden_state.permute(0, 2, 1).view(batch, hidden_state.shape[-1], rows, columns)
        hidden_state = self.downsampler2(self.downsampler1(hidden_state))
        return BaseModelOutput(last_hidden_state=hidden_state.flatten(2).permute(0, 2, 1))

    return capture_outputs(tie_last_hidden_states=False)(forward)


@register_patch("dynamo", "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward")
def _patch_dbrx_experts_dense(_original):
    """DBRX's experts, every one on every token (`_every_expert`), each a slice of the packed GLU weights."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        shape = hidden_states.shape
        packed = (-1, self.ffn_hidden_size, self.hidden_size)
        w1, v1, w2 = (weight.view(packed) for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
        experts = [lambda x, i=i: self.mlp(x, w1[i], v1[i], w2[i]) for i in range(self.num_experts)]
        flat = hidden_states.reshape(-1, self.hidden_size)
        return _every_expert(flat, top_k_index, top_k_weights, experts).view(shape)

    return forward


@register_patch("dynamo", "transformers.models.gemma3n.modeling_gemma3n.Gemma3nTextMLP._gaussian_topk")
def _patch_gemma3n_constant_icdf(_original):
    """Gemma 3n's sparse MLP takes the normal quantile of a constant (its target sparsity) with `Normal.icdf`,
    traced as `erfinv`: ONNX has no such function and ExecuTorch's Core ATen check rejects it. The quantile is the
    same number computed once in Python, so the traced graph keeps only the arithmetic on the inputs."""

    def gaussian_topk(self, inputs):
        std_multiplier = statistics.NormalDist().inv_cdf(self.activation_sparsity)
        inputs_mean = torch.mean(inputs, dim=-1, keepdim=True)
        inputs_std = torch.std(inputs, dim=-1, keepdim=True, unbiased=False)
        return torch.nn.functional.relu(inputs - (inputs_mean + inputs_std * std_multiplier))

    return gaussian_topk


@register_patch(
    "dynamo",
    *(
        f"transformers.models.{module}.{name}ForXVector.forward"
        for module, name in (
            ("wav2vec2.modeling_wav2vec2", "Wav2Vec2"),
            ("wav2vec2_bert.modeling_wav2vec2_bert", "Wav2Vec2Bert"),
            ("wav2vec2_conformer.modeling_wav2vec2_conformer", "Wav2Vec2Conformer"),
            ("data2vec.modeling_data2vec_audio", "Data2VecAudio"),
            ("unispeech_sat.modeling_unispeech_sat", "UniSpeechSat"),
            ("wavlm.modeling_wavlm", "WavLM"),
        )
    ),
)
def _patch_xvector_masked_statistics(original):
    """X-vector heads pool each sample's mean and std over its own length with a Python loop over the batch
    (`hidden_states[i, :length]`): the batch axis is fixed and ExecuTorch cannot lower the slice to an unbacked
    length. The same statistics come from a frame mask over the whole batch at once."""

    def forward(self, *args, attention_mask=None, labels=None, **kwargs):
        from transformers.modeling_outputs import XVectorOutput

        if attention_mask is None:
            return original(self, *args, labels=labels, **kwargs)
        if self.config.use_weighted_layer_sum:
            kwargs["output_hidden_states"] = True
        outputs = getattr(self, self.base_model_prefix)(*args, attention_mask=attention_mask, **kwargs)
        if self.config.use_weighted_layer_sum:
            weights = torch.nn.functional.softmax(self.layer_weights, dim=-1)
            hidden_states = (torch.stack(outputs.hidden_states, dim=1) * weights.view(-1, 1, 1)).sum(dim=1)
        else:
            hidden_states = outputs.last_hidden_state
        hidden_states = self.projector(hidden_states)
        for tdnn_layer in self.tdnn:
            hidden_states = tdnn_layer(hidden_states)

        lengths = self._get_tdnn_output_lengths(self._get_feat_extract_output_lengths(attention_mask.sum(dim=1)))
        frames = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        mask = (frames[None, :] < lengths[:, None]).unsqueeze(-1).to(hidden_states.dtype)
        count = mask.sum(dim=1)
        mean = (hidden_states * mask).sum(dim=1) / count
        std = (((hidden_states - mean[:, None]) ** 2 * mask).sum(dim=1) / (count - 1)).sqrt()

        output_embeddings = self.feature_extractor(torch.cat([mean, std], dim=-1))
        logits = self.classifier(output_embeddings)
        loss = self.objective(logits, labels) if labels is not None else None
        return XVectorOutput(
            loss=loss,
            logits=logits,
            embeddings=output_embeddings,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    return forward


@register_patch(
    "dynamo",
    "transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2RotaryEmbedding.forward",
    "transformers.models.llama4.modeling_llama4.Llama4TextRotaryEmbedding.forward",
)
def _patch_complex_rotary_as_pairs(_original):
    """DeepSeek-V2 and Llama 4 make their rotary table complex (`torch.polar`) and rotate with complex products:
    ONNX has no complex tensors and ExecuTorch cannot lower `view_as_complex`. The table becomes real (cos, sin)
    pairs on a last axis of 2, and `_patch_rotate_pairs` rotates with them, the same numbers in real arithmetic."""
    from transformers.modeling_rope_utils import dynamic_rope_update

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack((freqs.cos(), freqs.sin()), dim=-1) * self.attention_scaling

    return forward


def _rotate_pairs(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """``x * (cos + i sin)`` on the interleaved (real, imaginary) pairs of x's last axis."""
    real, imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    cos, sin = cos_sin.unbind(-1)
    return torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1).flatten(-2).type_as(x)


@register_patch(
    "dynamo",
    "transformers.models.deepseek_v2.modeling_deepseek_v2.apply_rotary_emb",
    "transformers.models.llama4.modeling_llama4.apply_rotary_emb",
)
def _patch_rotate_pairs(original):
    """The rotation half of `_patch_complex_rotary_as_pairs`. DeepSeek-V2 rotates (batch, heads, seq, dim) and
    Llama 4 (batch, seq, heads, dim): the heads axis of the table goes where the model's own broadcast puts it."""
    heads_axis = 1 if original.__module__.endswith("deepseek_v2") else 2

    def apply_rotary_emb(xq, xk, freqs_cis):
        table = freqs_cis.unsqueeze(heads_axis)
        return _rotate_pairs(xq, table), _rotate_pairs(xk, table)

    return apply_rotary_emb


@register_patch("dynamo", "transformers.models.llava.modeling_llava.LlavaMultiModalProjector.forward")
def _patch_llava_features_as_one_image(original):
    """LLaVA splits its projected image features into a list, one tensor per image, which the model concatenates
    right back: iterating the image axis fixes the image count. The projector hands its rows on as one image, which
    the list and the concatenation leave as they are: the same rows in the same order."""

    def forward(self, image_features):
        projected = original(self, image_features)
        return projected.flatten(0, -2)[None]

    return forward


def _keys_cubic(distance: torch.Tensor) -> torch.Tensor:
    """Keys' cubic kernel with a = -0.5, the one torch's antialiased bicubic resize filters with."""
    x = distance.abs()
    near = (1.5 * x - 2.5) * x * x + 1
    far = ((-0.5 * x + 2.5) * x - 4) * x + 2
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _resize_weights(sizes: torch.Tensor, positions: torch.Tensor, source: int, antialias: bool,
                    mode: str = "bilinear") -> torch.Tensor:
    """The weights ``F.interpolate(mode=mode, align_corners=False)`` gives the ``source`` pixels of one axis for
    output ``positions`` when resized to ``sizes`` (tensors of a shape): a triangle one pixel wide (bilinear) or Keys'
    cubic two wide (bicubic, antialiased only), stretched by the scale when antialiased and shrinking; normalised,
    which clamps the edges as torch does. Zero outside the window."""
    scale = source / sizes.to(torch.float32)
    stretch = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    center = scale * (positions.to(torch.float32) + 0.5)
    pixels = torch.arange(source, dtype=torch.float32, device=sizes.device)
    distance = (pixels - center[..., None] + 0.5) / stretch[..., None]
    weights = _keys_cubic(distance) if mode == "bicubic" else (1 - distance.abs()).clamp(min=0)
    return weights / weights.sum(-1, keepdim=True)


def _resized(table: torch.Tensor, rows, row, columns, column, antialias=True) -> torch.Tensor:
    """The (rows, columns, channels) ``table`` resized (bilinear) to each position's grid of ``rows`` x ``columns``,
    read at its ``row`` and ``column`` (tensors of one shape): computed in float32, as torch on CPU."""
    row_weights = _resize_weights(rows, row, table.shape[0], antialias)
    column_weights = _resize_weights(columns, column, table.shape[1], antialias)
    resized = torch.einsum("...r,...c,rcd->...d", row_weights, column_weights, table.to(torch.float32))
    return resized.to(table.dtype)


@register_patch(
    "dynamo", "transformers.models.siglip2.modeling_siglip2.Siglip2VisionEmbeddings.resize_positional_embeddings"
)
def _patch_siglip2_positions_resized_as_tensors(original):
    """SigLIP 2 resizes its position grid to each image's patch grid in a Python loop over the batch, reading each
    size as numbers: the batch is fixed to the traced one and the sizes become data-dependent. Every padded position
    of every image is computed at once instead: its row and column in its image's grid, and the antialiased bilinear
    weights of those (padding repeats the first position, as eager writes it). Where an image is one patch wide,
    torch's CPU kernel answers otherwise (one value for the whole column): this is the resize it means."""

    def resize_positional_embeddings(positional_embeddings, spatial_shapes, max_length):
        if not isinstance(spatial_shapes, torch.Tensor):
            return original(positional_embeddings, spatial_shapes, max_length)
        rows, columns = spatial_shapes[:, :1], spatial_shapes[:, 1:]
        positions = torch.arange(max_length, device=spatial_shapes.device)[None]
        positions = torch.where(positions < rows * columns, positions, 0)
        return _resized(positional_embeddings, rows, positions // columns, columns, positions % columns)

    return resize_positional_embeddings


def _block_patches(block_row, block_column, columns, factor):
    """Where, in row-major grids ``columns`` patches wide, the patches of each factor x factor block lie: the block
    coordinates' shape, then (factor, factor) in the block's row-major order."""
    offset = torch.arange(factor, device=block_row.device)
    row = (block_row * factor)[..., None, None] + offset[:, None]
    column = (block_column * factor)[..., None, None] + offset
    return row * columns[..., None, None] + column


@register_patch("dynamo", "transformers.models.lfm2_vl.modeling_lfm2_vl.Lfm2VlModel.get_image_features")
def _patch_lfm2_vl_images_projected_at_once(original):
    """LFM2-VL projects its images one by one in a Python loop: it cuts each image's patches out of the padded rows,
    folds each 2x2 block of patches into one vector and projects them; the loop fixes the image count. Every image
    at once instead: the patches of every block are gathered from the padded rows (in the order the fold lays them
    out, so the projector's fold leaves them as they are), projected, and the blocks each image really has kept."""

    def get_image_features(self, pixel_values, spatial_shapes, pixel_attention_mask, **kwargs):
        if not isinstance(spatial_shapes, torch.Tensor):
            return original(self, pixel_values, spatial_shapes, pixel_attention_mask, **kwargs)
        image_outputs = self.vision_tower(pixel_values=pixel_values, spatial_shapes=spatial_shapes,
                                          pixel_attention_mask=pixel_attention_mask, **{**kwargs, "return_dict": True})
        patches = image_outputs.last_hidden_state  # (images, padded patches, channels)
        images, padded, channels = patches.shape
        factor = self.multi_modal_projector.factor
        rows, columns = spatial_shapes[:, 0, None], spatial_shapes[:, 1, None]
        block = torch.arange(padded // factor**2, device=patches.device)[None]
        blocks_per_row = columns // factor
        kept = block < (rows // factor) * blocks_per_row
        block = torch.where(kept, block, 0)
        source = _block_patches(block // blocks_per_row, block % blocks_per_row, columns, factor)
        source = source.flatten(1)  # (images, blocks x factor x factor)
        gathered = patches.gather(1, source[..., None].expand(-1, -1, channels))
        folded = gathered.reshape(images, -1, factor, channels)  # the projector folds (row, column) blocks
        projected = self.multi_modal_projector(folded).flatten(1, 2)
        image_outputs.pooler_output = [projected[kept]]
        return image_outputs

    return get_image_features


def _geometry_baked(sizes: torch.Tensor) -> bool:
    """Whether the trace knows these size inputs' values, as a static export bakes them in: the model's own
    image-by-image code then traces to the fixed shapes a static program wants."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(sizes, FakeTensor) and sizes.constant is not None


def _computed_from_baked(function, sizes: torch.Tensor, *args):
    """``function(sizes, *args)`` run now on the baked sizes' real values, for code that reads nothing else: traced,
    its boolean indexing gives lengths the trace cannot know (unbacked), which ExecuTorch's re-trace then guards on;
    the program holds the result as a constant instead."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        return function(sizes.constant, *args)


_ANYRES_MODELS = (("llava_next", "LlavaNextModel"), ("llava_next_video", "LlavaNextVideoModel"),
                  ("llava_onevision", "LlavaOnevisionModel"), ("granite4_vision", "Granite4VisionModel"))


class _AnyresImages:
    """LLaVA-NeXT-style images kept together for the export, given in place of ``image_sizes``: the model's code
    reads them as one image holding every image's tiles, so its count, split and pack leave the tiles together, and
    the patched pack lays every image out at once from ``sizes``."""

    def __init__(self, sizes: torch.Tensor, tiles_per_image: int):
        self.sizes, self.tiles_per_image = sizes, tiles_per_image

    def __iter__(self):
        return iter((self,))

    def __len__(self):
        return 1


def _best_resolutions(sizes: torch.Tensor, resolutions: torch.Tensor) -> torch.Tensor:
    """`select_best_resolution` for every (height, width) row of ``sizes`` at once: the index of the first
    resolution that keeps the most of the image, then wastes the least."""
    original_height, original_width = sizes.double().unbind(-1)
    height, width = resolutions.double().unbind(-1)
    scale = torch.minimum(width / original_width[:, None], height / original_height[:, None])
    kept = ((original_width[:, None] * scale).floor() * (original_height[:, None] * scale).floor())
    kept = torch.minimum(kept, (original_width * original_height)[:, None])
    wasted = height * width - kept
    return (kept * (height * width).max() + 1 - wasted).argmax(-1)  # wasted <= area: more kept always wins


def _anyres_packed(tiles, images: _AnyresImages, pinpoints, tile_size: int, newline):
    """What LLaVA-NeXT's `pack_image_features` gives, for every image at once: each image's first tile (its
    overview), then its other tiles laid out as the grid its best resolution picks, unpadded to the image's aspect
    and ended row by row by ``newline``. ``tiles``: (images x tiles per image, tokens, channels). Returns the
    images' features end to end, and each image's length."""
    sizes, device = images.sizes, tiles.device
    tokens = tiles.shape[1]
    side = math.isqrt(tokens)  # tokens per tile side
    resolutions = torch.tensor(pinpoints, device=device)
    grid = (resolutions // tile_size)[_best_resolutions(sizes, resolutions)][:, :, None, None]
    height, width = grid[:, 0] * side, grid[:, 1] * side  # (images, 1, 1)
    original_height, original_width = sizes[:, 0, None, None], sizes[:, 1, None, None]
    # unpad_image: the side the image's aspect leaves short loses its padding, half at each end
    # in double precision as eager's Python floats; round(x, 7) spelt in core ops (ExecuTorch has no round.decimals)
    exact_height, exact_width = original_height.double(), original_width.double()
    unpadded_height = ((exact_height * (width / exact_width) * 1e7).round() / 1e7).floor().long()
    unpadded_width = ((exact_width * (height / exact_height) * 1e7).round() / 1e7).floor().long()
    wider = original_width * height > width * original_height
    top = torch.where(wider, (height - unpadded_height) // 2, 0)
    left = torch.where(wider, 0, (width - unpadded_width) // 2)
    most_rows = max(height // tile_size for height, _ in pinpoints) * side
    most_columns = max(width // tile_size for _, width in pinpoints) * side
    row = torch.arange(most_rows, device=device)[:, None]
    column = torch.arange(most_columns + 1, device=device)  # the last column: the row's newline
    ends_row = column == most_columns
    inside = ((row >= top) & (row < height - top) & (ends_row | (column >= left) & (column < width - left)))
    if newline is None:
        inside &= ~ends_row
    image = torch.arange(sizes.shape[0], device=device)[:, None]
    first_tile = image * images.tiles_per_image
    tile = first_tile[..., None] + 1 + (row // side) * grid[:, 1] + column // side
    source = torch.where(ends_row, tiles.shape[0] * tokens, tile * tokens + (row % side) * side + column % side)
    overview = first_tile * tokens + torch.arange(tokens, device=device)
    order = torch.cat([overview, source.flatten(1)], dim=1)
    kept = torch.cat([torch.ones_like(overview, dtype=torch.bool), inside.flatten(1)], dim=1)
    table = tiles.flatten(0, 1)
    if newline is not None:
        table = torch.cat([table, newline[None].to(table)])
    return table[order[kept]], kept.sum(1)


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.get_image_features"
                            for module, model in _ANYRES_MODELS), reports=True)
def _patch_anyres_images_packed_at_once(original):
    """LLaVA-NeXT-style models read each image's size as numbers to count its tiles (the best of the configured
    resolutions), cut them out of the padded tiles, split the features per image and unpad each image's grid: the
    loops fix the image count and the sizes become data-dependent. The tiles of every image go through the tower
    together instead (a padding tile changes no other), and `_patch_anyres_packs_at_once` lays them out with the
    sizes as tensors. OneVision also shrinks a grid too large for `vision_aspect_ratio`: where its resolutions can
    give one, the model's own code runs."""
    shrinks = "vision_aspect_ratio" in inspect.signature(original).parameters

    def get_image_features(self, pixel_values, image_sizes, *args, **kwargs):
        config = self.config
        tile_grids = [(height // config.vision_config.image_size) * (width // config.vision_config.image_size)
                      for height, width in config.image_grid_pinpoints]
        aspect = kwargs.get("vision_aspect_ratio") or getattr(config, "vision_aspect_ratio", None) or "anyres_max_9"
        may_shrink = shrinks and math.sqrt(max(tile_grids) / int(aspect.strip("anyres_max_"))) > 1.1
        if (_geometry_baked(image_sizes) or pixel_values.dim() != 5 or may_shrink
                or kwargs.get("batch_num_images") is not None):
            return original(self, pixel_values, image_sizes, *args, **kwargs)
        report_applied()
        images = _AnyresImages(image_sizes, pixel_values.shape[1])
        return original(self, pixel_values.flatten(0, 1), images, *args, **kwargs)

    return get_image_features


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.image_size_to_num_patches"
                            for module, _ in _ANYRES_MODELS))
def _patch_anyres_tiles_counted_together(original):
    """`_AnyresImages` reads as one image holding every image's tiles."""

    def image_size_to_num_patches(image_size, grid_pinpoints, patch_size):
        if isinstance(image_size, _AnyresImages):
            return image_size.sizes.shape[0] * image_size.tiles_per_image
        return original(image_size, grid_pinpoints, patch_size)

    return image_size_to_num_patches


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}.pack_image_features"
                            for module, model in _ANYRES_MODELS))
def _patch_anyres_packs_at_once(original):
    """Given `_AnyresImages`, every image is packed at once (`_anyres_packed`), as one part of the per-image list.
    Granite 4 Vision's pack returns the list alone, the others the lengths too."""
    with_lengths = not original.__qualname__.startswith("Granite4VisionModel.")

    def pack_image_features(self, image_features, image_sizes, *args, image_newline=None, **kwargs):
        if not isinstance(image_sizes, _AnyresImages):
            return original(self, image_features, image_sizes, *args, image_newline=image_newline, **kwargs)
        (tiles,) = image_features
        packed, lengths = _anyres_packed(tiles, image_sizes, self.config.image_grid_pinpoints,
                                         self.config.vision_config.image_size, image_newline)
        return ([packed], lengths) if with_lengths else [packed]

    return pack_image_features


def _superpoint_keypoints_at_once(model, pixel_values, output_hidden_states=None, return_dict=None):
    """SuperPoint's detection for every image of the batch at once: the pixels over the threshold away from the
    border, in row-major order (in descending score where more than `max_keypoints` qualify, then the best of them),
    padded to the most any image keeps, as eager pads them."""
    from transformers.models.superpoint.modeling_superpoint import SuperPointKeypointDescriptionOutput

    output_hidden_states = model.config.output_hidden_states if output_hidden_states is None else output_hidden_states
    pixel_values = model.extract_one_channel_pixel_values(pixel_values)
    height, width = pixel_values.shape[-2:]
    encoded = model.encoder(pixel_values, output_hidden_states=output_hidden_states, return_dict=True)
    hidden = encoded.last_hidden_state
    detector = model.keypoint_decoder
    scores = detector._get_pixel_scores(hidden).flatten(1)  # (images, pixels), row-major
    pixel = torch.arange(scores.shape[1], device=scores.device)
    row, column, border = pixel // width, pixel % width, detector.border_removal_distance
    # as eager: its far borders are measured on a map 8 times larger than the scores' (which span the image)
    inside = (row >= border) & (row < 8 * height - border) & (column >= border) & (column < 8 * width - border)
    candidate = (scores > detector.keypoint_threshold) & inside
    count = candidate.sum(1)
    # the candidates first, in row-major order (distinct keys: ONNX has no stable sort)
    order = torch.where(candidate, pixel, pixel + scores.shape[1]).argsort(dim=1)
    if detector.max_keypoints >= 0:
        best_first = torch.where(candidate, scores, -torch.inf).argsort(dim=1, descending=True)
        order = torch.where((count > detector.max_keypoints)[:, None], best_first, order)
        count = count.clamp(max=detector.max_keypoints)
    most = count.max().item()
    torch._check(most <= scores.shape[1])
    slot = torch.arange(most, device=scores.device)
    order = order.index_select(1, slot)  # not a slice: ONNX's decompositions lose an unbacked slice's end
    kept = slot < count[:, None]
    keypoints = torch.stack([order % width, order // width], dim=-1).to(scores.dtype)  # (x, y)
    descriptors = model.descriptor_decoder.conv_descriptor_b(
        model.descriptor_decoder.relu(model.descriptor_decoder.conv_descriptor_a(hidden)))
    descriptors = torch.nn.functional.normalize(descriptors, p=2, dim=1)
    descriptors = model.descriptor_decoder._sample_descriptors(keypoints, descriptors, 8).transpose(1, 2)
    keypoints = torch.where(kept[..., None], keypoints, 0) / torch.tensor([width, height], device=scores.device)
    output = SuperPointKeypointDescriptionOutput(
        keypoints=keypoints, scores=torch.where(kept, scores.gather(1, order), 0),
        descriptors=torch.where(kept[..., None], descriptors, 0), mask=kept.int(),
        hidden_states=encoded.hidden_states if output_hidden_states else None)
    use_dict = model.config.return_dict if return_dict is None else return_dict
    return output if use_dict else output.to_tuple()


@register_patch("dynamo", "transformers.models.superpoint.modeling_superpoint.SuperPointForKeypointDetection.forward",
                reports=True)
def _patch_superpoint_keypoints_of_every_image_at_once(original):
    """SuperPoint detects and describes keypoints image by image in a Python loop (each image its own count, from
    `nonzero`) and pads them to the largest count: the loop fixes the batch, and the largest of several counts read
    from the data is more than a static trace can branch on (SuperGlue's empty-set check). Every image is handled at
    once (`_superpoint_keypoints_at_once`); only the longest count is read from the data."""

    def forward(self, pixel_values, labels=None, output_hidden_states=None, return_dict=None, **kwargs):
        if labels is not None:
            return original(self, pixel_values, labels, output_hidden_states, return_dict, **kwargs)
        report_applied()
        return _superpoint_keypoints_at_once(self, pixel_values, output_hidden_states, return_dict)

    return forward


@register_patch("dynamo",
                "transformers.models.lightglue.modeling_lightglue.LightGlueForKeypointMatching._match_image_pair",
                reports=True)
def _patch_lightglue_stops_and_prunes_by_masks(original):
    """LightGlue stops each pair at the first layer confident enough (`if torch.any(stopped)`) and drops the
    keypoints it prunes from the next layers, so how much it computes is read from the data. Every layer runs on
    every pair instead: a pruned keypoint is masked out of attention rather than dropped (same values: masked keys
    weigh nothing), a pair's matches are taken from the layer where it stops, and each keypoint counts the layers
    it was kept in. Eager drops keypoints by packing the kept ones first and padding with zeros, then scatters its
    results back with -1 as the padding index: the last keypoint of an image with padding gets a padding row's
    score (small, not zero). The program zeroes what it masks and reports the last keypoint's own row there: the
    same value while nothing is pruned; once pruning has packed eager's rows it may differ by that small score."""
    from transformers.models.lightglue import modeling_lightglue as lightglue

    def _match_image_pair(self, keypoints, descriptors, height, width, mask=None, output_attentions=None,
                          output_hidden_states=None):
        # a traced keypoint count is known to be two or more here: the next patch, registered after this one, wraps
        # it and checks that first
        if (mask is None or output_attentions or output_hidden_states or self.depth_confidence <= 0
                or self.width_confidence <= 0 or keypoints.shape[2] == 0):
            return original(self, keypoints, descriptors, height, width, mask, output_attentions,
                            output_hidden_states)
        report_applied()
        pairs, _, count, _ = keypoints.shape
        valid_per_pair = mask.reshape(pairs, -1).sum(dim=1)
        keypoints = lightglue.normalize_keypoints(keypoints.reshape(pairs * 2, count, 2), height, width)
        descriptors = descriptors.reshape(pairs * 2, count, self.keypoint_detector_descriptor_dim)
        descriptors, (positions, *_) = self._keypoint_processing(descriptors, keypoints)
        live = mask.reshape(pairs * 2, count).bool()  # valid and not pruned yet
        running = torch.ones(pairs * 2, 1, dtype=torch.bool, device=keypoints.device)  # per image, pair-wise
        matches = torch.full((pairs * 2, count), -1, dtype=torch.long, device=keypoints.device)
        scores = torch.zeros(pairs * 2, count, dtype=descriptors.dtype, device=keypoints.device)
        layers_kept = torch.ones(pairs * 2, count, dtype=torch.long, device=keypoints.device)
        # eager writes its padding rows' results at index -1: the last keypoint's own row when nothing was pruned
        last_keypoint = torch.arange(count, device=keypoints.device) == count - 1
        for layer in range(self.num_layers):
            attention_mask = lightglue.create_bidirectional_mask(
                config=self.config, inputs_embeds=descriptors[:, 0:1, :], attention_mask=live.to(mask.dtype),
                allow_is_bidirectional_skip=False)
            descriptors = self.transformer_layers[layer](descriptors, positions, attention_mask=attention_mask)[0]
            last = layer == self.num_layers - 1
            if not last:
                confidences = self.token_confidence[layer](descriptors)
                confident = self._get_early_stopped_image_pairs(confidences, layer, live, num_points=valid_per_pair)
                stopping = running & confident.repeat_interleave(2)[:, None]
            else:
                stopping = running
            layer_matches, layer_scores = self._get_keypoint_matching(descriptors, live, layer)
            written = stopping & (live | last_keypoint)
            matches = torch.where(written, layer_matches, matches)
            scores = torch.where(written, layer_scores, scores)
            running = running & ~stopping
            if not last:
                matchability = self.match_assignment_layers[layer].get_matchability(descriptors)
                kept = self._get_pruning_mask(confidences, matchability, layer) & live
                layers_kept = layers_kept + (kept & running).long()
                live = torch.where(running, kept, live)
                # eager pads what it drops with zeros, and the padding rows' results reach the last keypoint
                descriptors = torch.where(live[..., None], descriptors, 0)
                positions = tuple(torch.where(live[..., None], part, 0) for part in positions)
        return (matches.reshape(pairs, 2, count), scores.reshape(pairs, 2, count),
                layers_kept.reshape(pairs, 2, count), None, None)

    return _match_image_pair


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{model}._match_image_pair"
                            for module, model in (("superglue", "SuperGlueForKeypointMatching"),
                                                  ("lightglue", "LightGlueForKeypointMatching"))), reports=True)
def _patch_keypoint_matching_of_two_keypoints_or_more(original):
    """SuperGlue and LightGlue branch on an empty keypoint set, and their attention on a single keypoint: with the
    count read from the data (`_patch_superpoint_keypoints_of_every_image_at_once`) the trace cannot take either
    branch. The program takes the matching branch, for images of two keypoints or more; a batch where every image
    has fewer is refused at run time."""

    def _match_image_pair(self, keypoints, *args, **kwargs):
        if isinstance(keypoints.shape[2], torch.SymInt):
            report_applied()
            torch._check(keypoints.shape[2] > 1)
        return original(self, keypoints, *args, **kwargs)

    return _match_image_pair


@register_patch("dynamo", "transformers.models.pixtral.modeling_pixtral.PixtralVisionModel.forward", reports=True)
def _patch_pixtral_patches_picked_at_once(original):
    """Pixtral crops each image's patches out of its padded grid with one Python slice per image (sizes read from
    `image_sizes`), lays them end to end and builds the block mask image by image: the loops fix the image count.
    Every image at once instead: the indices of the real patches of the padded grids pick them in the same order
    (image, row, column), and tell each patch's position and image."""
    from transformers.utils.generic import is_flash_attention_requested, merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, image_sizes=None, **kwargs):
        whole = image_sizes is None and isinstance(pixel_values.shape[0], torch.SymInt)  # every image uncropped
        traced_sizes = isinstance(image_sizes, torch.Tensor) and not _geometry_baked(image_sizes)
        if is_flash_attention_requested(self.config) or not (whole or traced_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        patch_embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))
        images, channels, rows, columns = patch_embeds.shape
        if whole:
            index = torch.arange(images * rows * columns, device=patch_embeds.device)
        else:
            grid = (torch.arange(rows, device=patch_embeds.device)[:, None] * columns
                    + torch.arange(columns, device=patch_embeds.device))
            sizes = (image_sizes // self.patch_size)[:, :, None, None]
            real = (grid // columns < sizes[:, 0]) & (grid % columns < sizes[:, 1])
            index = real.flatten().nonzero().squeeze(1)
            # attention branches on a sequence longer than one; a single real patch is refused at run time instead
            torch._check(index.shape[0] > 1)
        image, cell = index // (rows * columns), index % (rows * columns)
        patch_embeds = patch_embeds.permute(0, 2, 3, 1).reshape(-1, channels)[index][None]
        patch_embeds = self.ln_pre(patch_embeds)
        position_ids = torch.stack([cell // columns, cell % columns], dim=-1)
        position_embeddings = self.patch_positional_embedding(patch_embeds, position_ids)
        lowest = torch.finfo(patch_embeds.dtype).min
        attention_mask = torch.where(image[:, None] == image, 0.0, lowest).to(patch_embeds.dtype)[None, None]
        return self.transformer(patch_embeds, attention_mask=attention_mask,
                                position_embeddings=position_embeddings, **kwargs)

    return merge_with_config_defaults(capture_outputs(forward))


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{prefix}PatchMerger.forward"
                            for module, prefix in (("mistral3", "Mistral3"), ("lighton_ocr", "LightOnOcr"),
                                                   ("mistral_large4", "MistralLarge4"))), reports=True)
def _patch_patch_merger_blocks_gathered(original):
    """Mistral 3's patch merger splits the patches image by image (sizes read from `image_sizes`) and unfolds each
    image's grid into blocks of merge x merge patches: the loop fixes the image count. The blocks of every image are
    counted and their patches gathered at once instead, laid out as unfold lays them (channel, then row and column
    in the block)."""

    def forward(self, image_features, image_sizes):
        if not isinstance(image_sizes, torch.Tensor) or _geometry_baked(image_sizes):
            return original(self, image_features, image_sizes)
        report_applied()
        merge = self.spatial_merge_size
        rows, columns = (image_sizes // self.patch_size).unbind(-1)
        block_columns = columns // merge
        blocks = (rows // merge) * block_columns
        slots = image_features.shape[0] // merge**2  # no image has more blocks than all the patches make
        slot = torch.arange(slots, device=image_features.device)
        index = (slot < blocks[:, None]).flatten().nonzero().squeeze(1)
        torch._check(index.shape[0] > 1)  # the callers squeeze a leading 1: a single block is refused at run time
        image, local = index // slots, index % slots
        patch_starts = _starts(rows * columns)
        source = patch_starts[image][:, None, None] + _block_patches(
            local // block_columns[image], local % block_columns[image], columns[image], merge)
        merged = image_features[source].permute(0, 3, 1, 2).flatten(1)
        return self.merging_layer(merged)

    return forward


@register_patch("dynamo", "transformers.models.paddleocr_vl.modeling_paddleocr_vl.PaddleOCRProjector.forward",
                reports=True)
def _patch_paddleocr_projector_blocks_gathered(original):
    """PaddleOCR-VL's projector cuts the patches image by image (sizes read with `.tolist()`) and folds each frame's
    merge x merge blocks: the loop fixes the image count. Every block of every image at once instead: each block
    finds its image among the images' cumulative block counts, and its patches are gathered in the fold's order."""

    def forward(self, image_features, image_grid_thw):
        if not isinstance(image_grid_thw, torch.Tensor) or _geometry_baked(image_grid_thw):
            return original(self, image_features, image_grid_thw)
        report_applied()
        merge = self.merge_kernel_size[0]
        frames, rows, columns = image_grid_thw.unbind(-1)
        block_columns = columns // merge
        frame_blocks = (rows // merge) * block_columns
        frame_patches = rows * columns
        patches = frames * frame_patches
        patch_starts = _starts(patches)
        image, local = _places_in_parts(frames * frame_blocks, image_features.shape[0] // merge**2)
        frame, in_frame = local // frame_blocks[image], local % frame_blocks[image]
        source = (patch_starts[image] + frame * frame_patches[image])[:, None, None] + _block_patches(
            in_frame // block_columns[image], in_frame % block_columns[image], columns[image], merge)
        folded = self.pre_norm(image_features)[source].flatten(1)
        return self.linear_2(self.act(self.linear_1(folded)))

    return forward


@register_patch(
    "dynamo",
    *(f"transformers.models.{module}.modeling_{module}.{model}.get_image_features" for module, model in (
        ("deepseek_ocr2", "DeepseekOcr2Model"), ("unlimited_ocr", "UnlimitedOcrModel"), ("step3p7", "Step3p7Model"))),
    reports=True,
)
def _patch_global_views_laid_out_at_once(original):
    """DeepSeek-OCR 2, Unlimited OCR and Step 3.7 lay out each image's global view in a loop over the batch (rows
    ended by a newline token in Unlimited OCR, a view separator after each image in both OCR models), and their
    forward joins the parts again: the loop fixes the image count. With no local views, every image at once, as one
    part."""
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, pixel_values_local=None, *local_layout, **kwargs):
        if pixel_values_local is not None or not isinstance(pixel_values.shape[0], torch.SymInt):
            return inspect.unwrap(original)(self, pixel_values, pixel_values_local, *local_layout, **kwargs)
        report_applied()
        for name in ("num_local_patches", "patches_grid"):  # how local views are laid out: there are none
            kwargs.pop(name, None)
        return _global_views_at_once(self, pixel_values, **kwargs)

    return can_return_tuple(get_image_features)


def _global_views_at_once(model, pixel_values, **kwargs):
    """Every image's global view through the tower and projector at once, laid out as the model lays each out (rows
    ended by its newline, then its view separator), as one part of the per-image list."""
    tower = model.vision_tower if hasattr(model, "vision_tower") else model.vision_model
    outputs = tower(pixel_values, **kwargs)
    features = model.multi_modal_projector(outputs.last_hidden_state)
    images, queries, hidden = features.shape
    if hasattr(model, "image_newline"):
        side = math.isqrt(queries)
        rows = torch.cat([features.reshape(images, side, side, hidden),
                          model.image_newline.expand(images, side, 1, hidden)], dim=2)
        features = rows.flatten(1, 2)
    if hasattr(model, "view_separator"):
        features = torch.cat([features, model.view_separator.expand(images, 1, hidden)], dim=1)
    outputs.pooler_output = [features.reshape(-1, hidden)]
    return outputs


@register_patch("dynamo", "transformers.models.lighton_ocr.modeling_lighton_ocr.LightOnOcrModel.get_image_features",
                reports=True)
def _patch_lighton_ocr_image_features_whole(original):
    """LightOnOcr splits its projected image features per image by sizes it reads by iterating `image_sizes`,
    which fixes the image count; its forward concatenates the parts again, so they are kept whole."""
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_sizes, **kwargs):
        if not isinstance(image_sizes, torch.Tensor) or _geometry_baked(image_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        image_outputs = self.vision_encoder(pixel_values, image_sizes=image_sizes, return_dict=True, **kwargs)
        features = self.vision_projection(image_outputs.last_hidden_state.squeeze(0), image_sizes)
        image_outputs.pooler_output = (features,)
        return image_outputs

    return can_return_tuple(get_image_features)


@register_patch("dynamo", "transformers.models.emu3.modeling_emu3.Emu3Model.get_image_features", reports=True)
def _patch_emu3_image_tokens_cropped_at_once(original):
    """Emu3 crops each image's VQ codes to the image's size and ends each kept row with an end-of-line token, image
    by image over `image_sizes`: it fixes the image count. Every image at once: the codes of the padded grid, an
    end-of-line column after each image's last kept column, and the kept cells picked by one mask in eager's order."""
    from transformers.models.emu3.modeling_emu3 import Emu3VQVAEModelOutput
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_sizes, **kwargs):
        if pixel_values.ndim != 4 or _geometry_baked(image_sizes):
            return inspect.unwrap(original)(self, pixel_values, image_sizes, **kwargs)
        report_applied()
        vq = self.vqmodel
        frames = pixel_values.unsqueeze(1).repeat(1, vq.config.temporal_downsample_factor, 1, 1, 1)
        hidden_states = vq.encoder(frames.to(vq.dtype))
        quantized = vq.quant_conv(hidden_states.permute(0, 2, 1, 3, 4)).permute(0, 2, 1, 3, 4)
        codes = vq.quantize(quantized).squeeze(1)  # (images, rows, columns)
        _, rows, columns = codes.shape
        mapping = self.vocabulary_mapping
        tokens = mapping.img2bpe_mapping_tensor.to(codes.device)[codes]
        tokens = torch.nn.functional.pad(tokens, (0, 1), value=mapping.eol_token_id)
        kept_rows, kept_columns = (image_sizes // vq.vision_spatial_factor).unbind(-1)
        row = torch.arange(rows, device=codes.device)[None, :, None]
        column = torch.arange(columns + 1, device=codes.device)[None, None, :]
        row_end = column == kept_columns[:, None, None]
        tokens = torch.where(row_end, mapping.eol_token_id, tokens)
        kept = (row < kept_rows[:, None, None]) & (column <= kept_columns[:, None, None])
        embeddings = self.get_input_embeddings()(tokens[kept])
        return Emu3VQVAEModelOutput(last_hidden_state=hidden_states, pooler_output=(embeddings,))

    return can_return_tuple(get_image_features)


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_position_ids" for module in (
    "muse_spark", "muse_glimmer", "kimi_k25", "qwen2_vl", "minimax_m3_vl", "inkling2")), reports=True)
def _patch_vision_positions_at_once(original):
    """`get_vision_position_ids` builds each image's (row, column) grid in a loop over `grid_thw.tolist()`, which
    fixes the image count; a composite model cannot take them precomputed (its text model reads `position_ids`),
    nor can a retriever that calls its tower directly (ColQwen2). For one merge size, every patch at once: its frame
    found among the frames' cumulative sizes, then its merge block and its place in the block from its offset in the
    frame. ExecuTorch plans memory for the total's upper bound: where no input axis bounds it before it sizes a
    tensor (Muse Spark, ColQwen2), the dynamic cell fails at `to-executorch`."""

    def get_vision_position_ids(grid_thw, spatial_merge_size, include_temporal=False, kwargs=None):
        precomputed = kwargs is not None and kwargs.get("position_ids") is not None
        if precomputed or not isinstance(spatial_merge_size, int) or _geometry_baked(grid_thw):
            return original(grid_thw, spatial_merge_size, include_temporal, kwargs)
        report_applied()
        total = _patch_total(grid_thw)
        frame, _, _, _, rows, columns = _merged_patch_places(grid_thw, spatial_merge_size, total)
        if not include_temporal:
            return torch.stack([rows, columns], dim=-1)
        frame_ends = grid_thw[:, 0].cumsum(0)  # each patch's frame, counted within its image or video
        image = torch.searchsorted(frame_ends, frame, right=True)
        return torch.stack([frame - (frame_ends - grid_thw[:, 0])[image], rows, columns], dim=-1)

    return get_vision_position_ids


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_nearest_position_ids"
                            for module in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")), reports=True)
def _patch_nearest_positions_at_once(original):
    """MiniCPM-V's towers map each patch to the nearest cell of their position table in a loop over
    `target_sizes.tolist()`: it fixes the image count, and a composite model cannot take them precomputed. Every
    patch at once instead: its row and column in its image (`_merged_patch_places`, blocks of one), bucketed."""

    def get_vision_nearest_position_ids(target_sizes, num_patches_per_side, kwargs=None):
        if (kwargs is not None and kwargs.get("position_ids") is not None) or _geometry_baked(target_sizes):
            return original(target_sizes, num_patches_per_side, kwargs=kwargs)
        report_applied()
        total = _patch_total(target_sizes)
        grid = torch.nn.functional.pad(target_sizes, (1, 0), value=1)  # one frame each
        _, _, rows, columns, row, column = _merged_patch_places(grid, 1, total)
        cells = 1 / num_patches_per_side
        boundaries = torch.arange(cells, 1.0, cells, device=target_sizes.device)
        bucket_row = torch.bucketize(row / rows, boundaries, right=True)
        bucket_column = torch.bucketize(column / columns, boundaries, right=True)
        return bucket_row * num_patches_per_side + bucket_column

    return get_vision_nearest_position_ids


@register_patch("dynamo", "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionEmbeddings"
                            ".resize_positional_embeddings", reports=True)
def _patch_cosmos3_edge_positions_resized_at_once(original):
    """Cosmos3-Edge resizes its position grid to each frame's patch grid in a loop over `grid_thw.tolist()`, which
    fixes the image count. Every patch at once instead, as `_patch_siglip2_positions_resized_as_tensors` does: its
    row and column in its frame (merge-block order, `_merged_patch_places`) and their antialiased bilinear weights."""

    def resize_positional_embeddings(positional_embeddings, grid_thw, spatial_merge_size):
        if _geometry_baked(grid_thw):
            return original(positional_embeddings, grid_thw, spatial_merge_size)
        report_applied()
        total = _patch_total(grid_thw)
        _, _, rows, columns, row, column = _merged_patch_places(grid_thw, spatial_merge_size, total)
        return _resized(positional_embeddings, rows, row, columns, column)

    return resize_positional_embeddings


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.get_vision_window_index"
                            for module in ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")), reports=True)
def _patch_whole_windows_at_once(original):
    """MiniCPM-V's window merger orders each image's patches window by window in a loop over `grid_thw.tolist()`,
    which fixes the image count. Its grids are whole windows (the merger checks it), so the order is the merge-block
    layout with windows for blocks: `_merged_patch_places` gives every slot's patch, and the windows' bounds step by
    a window's size. A static export knows the grids: the order is computed once, a constant of the program."""

    def get_vision_window_index(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=None):
        fed = kwargs is not None and kwargs.get("window_index") is not None
        if fed or (spatial_merge_size, patch_size) != (1, 1):
            return original(grid_thw, spatial_merge_size, window_size, patch_size, kwargs)
        report_applied()
        if _geometry_baked(grid_thw):
            return _computed_from_baked(original, grid_thw, spatial_merge_size, window_size, patch_size)
        total = _patch_total(grid_thw)
        _, start, _, columns, row, column = _merged_patch_places(grid_thw, window_size, total)
        bounds = torch.arange(0, total + 1, window_size**2, device=grid_thw.device, dtype=torch.int32)
        return start + row * columns + column, bounds

    return get_vision_window_index


@register_patch("dynamo", *(f"transformers.models.{module}.modeling_{module}.{prefix}Merger.forward"
                            for module, prefix in (("minicpm_ocr", "MiniCPMOcr"), ("minicpmv4_6", "MiniCPMV4_6"),
                                                   ("minicpmv4_7", "MiniCPMV4_7"))), reports=True)
def _patch_minicpm_merger_blocks_gathered(original):
    """MiniCPM-V's merger folds each image's patch grid into merge x merge blocks, round after round, in a Python
    loop over the images: it fixes the image count. Every image's blocks at once instead, each round: the patches
    of each block gathered (`_block_patches`) in the order the fold lays them out, and the round's projection."""

    def forward(self, hidden_states, target_sizes):
        merge, merge_w = self.merge_kernel_size
        if _geometry_baked(target_sizes) or merge != merge_w:
            return original(self, hidden_states, target_sizes)
        report_applied()
        features, sizes = hidden_states[0], target_sizes
        for projection in self.mlp:  # one per round
            merged = sizes // merge
            grid = torch.nn.functional.pad(merged, (1, 0), value=1)  # one frame each
            _, start, _, columns, row, column = _merged_patch_places(grid, 1, features.shape[0] // merge**2)
            source = start[:, None, None] * merge**2 + _block_patches(row, column, columns * merge, merge)
            features = projection(features[source.flatten(1)].flatten(1))
            sizes = merged
        return [features]

    return forward


def _patch_total(sizes: torch.Tensor, at_most=None) -> int:
    """How many patches images of these sizes (a row of grid sides each) hold: read from the data, one number;
    ``at_most`` (the patches the model was given) bounds it, so that ExecuTorch can plan memory for it."""
    total = sizes.prod(-1).sum().item()
    torch._check(total >= 0)
    if at_most is not None:
        torch._check(total <= at_most)
    return total


def _starts(sizes: torch.Tensor) -> torch.Tensor:
    """Where each part of these sizes begins, the parts laid end to end."""
    return sizes.cumsum(0) - sizes


def _places_in_parts(sizes: torch.Tensor, total) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the ``total`` items of parts of these sizes laid end to end: its part, and its offset in the part."""
    item = torch.arange(total, device=sizes.device)
    part = torch.searchsorted(sizes.cumsum(0), item, right=True)
    return part, item - _starts(sizes)[part]


def _merged_patch_places(grid_thw, merge, total):
    """Where each of the ``total`` patches of frames laid out merge block by merge block (Qwen-VL's order) lies: its
    frame (counted over every image), the frame's first patch, rows and columns, and its own row and column in it."""
    frames, heights, widths = grid_thw.unbind(-1)
    # image by image, not frame by frame: a list of every frame would have a data-dependent length of its own
    frame_sizes = heights * widths
    image_sizes = frames * frame_sizes
    image, in_image = _places_in_parts(image_sizes, total)
    frame_size = frame_sizes[image]
    frame_in_image, in_frame = in_image // frame_size, in_image % frame_size
    frame = _starts(frames)[image] + frame_in_image
    start = _starts(image_sizes)[image] + frame_in_image * frame_size
    rows, columns = heights[image], widths[image]
    block, within = in_frame // (merge * merge), in_frame % (merge * merge)
    row = block // (columns // merge) * merge + within // merge
    column = block % (columns // merge) * merge + within % merge
    return frame, start, rows, columns, row, column


@register_patch("dynamo", "transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe"
                            ".Ernie4_5_VLMoeVariableResolutionResamplerModel._temporal_slicing", reports=True)
def _patch_ernie_vl_frame_pairs_at_once(original):
    """Ernie 4.5-VL's resampler pairs each video's even frames with its odd ones (an image with itself) in a loop over
    `grid_thw` and Python ranges of its frame counts: it fixes the image count. Every merged token's two rows at once
    instead, from its image, its pair and its place in the frame; a video's odd last frame is dropped as eager's
    `zip` drops it."""

    def _temporal_slicing(self, hidden_states, grid_thw):
        if _geometry_baked(grid_thw):
            return original(self, hidden_states, grid_thw)
        report_applied()
        frames = grid_thw[:, 0]
        frame_tokens = grid_thw[:, 1:].prod(-1) // self.spatial_merge_size**2
        pairs = torch.where(frames > 1, frames // 2, 1)
        starts = _starts(frames * frame_tokens)
        total = _patch_total(torch.stack([pairs, frame_tokens], dim=-1))
        image, within = _places_in_parts(pairs * frame_tokens, total)
        pair, token = within // frame_tokens[image], within % frame_tokens[image]
        first = starts[image] + 2 * pair * frame_tokens[image] + token
        second = first + (frames[image] > 1).long() * frame_tokens[image]
        return torch.cat([hidden_states.index_select(0, first), hidden_states.index_select(0, second)], dim=-1)

    return _temporal_slicing


@register_patch("dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel"
                            ".pixel_unshuffle", reports=True)
def _patch_video_llama3_blocks_shrunk_at_once(original):
    """VideoLLaMA 3's tower lays each image's merge blocks back out in rows and shrinks the grid by the image's merge
    size (bilinear), image by image over `grid_thw`: it fixes the image count. A shrink by a whole factor samples
    each block's middle (one patch for an odd merge size, the middle four halfway for an even one): every block at
    once instead, from its patches, with eager's weights."""

    def pixel_unshuffle(self, hidden_states, grid_thw, merge_sizes):
        if _geometry_baked(grid_thw):
            return original(self, hidden_states, grid_thw, merge_sizes)
        report_applied()
        frames, rows, columns = grid_thw.unbind(-1)
        merges = merge_sizes.to(grid_thw.dtype)
        blocks = torch.stack([frames, rows // merges, columns // merges], dim=-1)
        image, block = _places_in_parts(blocks.prod(-1), _patch_total(blocks, at_most=hidden_states.shape[0]))
        patches = grid_thw.prod(-1)
        merge = merges[image]
        first = _starts(patches)[image] + block * merge * merge
        near, far = (merge - 1) // 2, merge // 2
        weight = (merge % 2 == 0).to(hidden_states.dtype)[:, None] / 2  # the source's fraction past `near`

        def between(row, left, right):
            return (1 - weight) * hidden_states[first + row * merge + left] + weight * hidden_states[
                first + row * merge + right]

        return (1 - weight) * between(near, near, far) + weight * between(far, near, far)

    return pixel_unshuffle


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLVisionPatchEmbed.forward",
                reports=True)
def _patch_hunyuan_vl_positions_resized_at_once(original):
    """HunYuan-VL resizes its position table to each image's grid, image by image over `grid_thw`: it fixes the
    image count. Every patch's position at once instead, from transformers' taps for all images."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    def forward(self, pixel_values, grid_thw):
        if not isinstance(grid_thw, torch.Tensor) or _geometry_baked(grid_thw):
            return original(self, pixel_values, grid_thw)
        report_applied()
        patches = pixel_values.reshape(-1, self.config.num_channels, self.patch_size, self.patch_size)
        embeddings = self.patch_embedding(patches.to(self.patch_embedding.weight.dtype)).flatten(1)
        indices, weights = get_vision_interpolation_indices_and_weights(grid_thw, self.position_edge,
                                                                        self.config.interpolate_mode)
        table = self.position_embedding.weight[1:].float()  # the first row is the class token's
        positions = (table[indices] * weights[..., None]).sum(1).to(embeddings.dtype)
        return (embeddings + positions).unsqueeze(0)

    return forward


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLVisionTransformer.forward",
                reports=True)
def _patch_hunyuan_vl_images_merged_at_once(original):
    """HunYuan-VL's tower merges each image's patches (a strided convolution), ends each merged row with a newline
    and puts the image between begin and end tokens, image by image over `grid_thw.tolist()`: it fixes the image
    count. Every image at once instead: each merged cell from its block's patches, then every image's layout
    gathered from the cells and the newline."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.models.hunyuan_vl import modeling_hunyuan_vl
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def forward(self, pixel_values, grid_thw, **kwargs):
        if _geometry_baked(grid_thw):
            return inspect.unwrap(original)(self, pixel_values, grid_thw, **kwargs)
        report_applied()
        hidden_states = self.embeddings(pixel_values, grid_thw)
        cu_seqlens, max_seqlen = modeling_hunyuan_vl.get_vision_attention_seqlens(grid_thw, self.config, kwargs=kwargs)
        for layer in self.layers:
            hidden_states = layer(hidden_states, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, attention_mask=None,
                                  **kwargs)
        merged = _hunyuan_vl_merged(self.patch_merger, hidden_states[0], grid_thw)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=merged[None])

    return merge_with_config_defaults(capture_outputs(forward))


def _hunyuan_vl_merged(merger, patches, grid_thw):
    """HunYuan-VL's merger over every image at once (one frame each, as the merger reshapes them): the cells, each
    image's begin, rows of cells each ended by the newline, and end."""
    merge = merger.spatial_merge_size
    rows, columns = grid_thw[:, 1], grid_thw[:, 2]
    cell_rows, cell_columns = rows // merge, columns // merge
    cells = torch.stack([cell_rows, cell_columns], dim=-1)
    image, cell = _places_in_parts(cells.prod(-1), _patch_total(cells))
    starts = _starts(rows * columns)
    source = starts[image][:, None, None] + _block_patches(
        cell // cell_columns[image], cell % cell_columns[image], columns[image], merge)
    blocks = merger.before_rms(patches)[source]  # (cells, merge, merge, channels)
    convolution = merger.proj_conv
    folded = torch.nn.functional.linear(blocks.permute(0, 3, 1, 2).flatten(1), convolution.weight.flatten(1),
                                        convolution.bias)
    projected = merger.proj_out(merger.proj_act(folded)[:, :, None, None]).flatten(1)
    rows_of = torch.cat([projected, merger.image_newline[None].to(projected.dtype)])  # the newline last

    layouts = cell_rows * (cell_columns + 1) + 2
    image, slot = _places_in_parts(layouts, _patch_total(layouts[:, None]))
    place, width = slot - 1, cell_columns[image] + 1  # place: within the rows, after the begin token
    first_cell = _starts(cells.prod(-1))[image]
    is_cell = (slot > 0) & (slot < layouts[image] - 1) & (place % width < width - 1)
    picked = torch.where(is_cell, first_cell + place // width * (width - 1) + place % width, projected.shape[0])
    tokens = merger.mlp(rows_of[picked])
    begin, end = (slot == 0)[:, None], (slot == layouts[image] - 1)[:, None]
    tokens = torch.where(begin, merger.image_begin.to(tokens.dtype), torch.where(end, merger.image_end, tokens))
    return merger.after_rms(tokens)


@register_patch("dynamo", "transformers.models.radio.modeling_radio.RadioPatchEmbeddings._embed_packed_patches",
                reports=True)
def _patch_radio_packed_images_at_once(original):
    """RADIO embeds packed images one by one over `image_grid_hw.tolist()` (its class and register tokens, then its
    patches with the position table resized to a square of its longer side, cropped): it fixes the image count.
    Every token at once instead: its image, and a token of the prefix or a patch with its resized position."""

    def _embed_packed_patches(self, pixel_values, image_grid_hw):
        if _geometry_baked(image_grid_hw):
            return original(self, pixel_values, image_grid_hw)
        report_applied()
        patches = self.patch_projection(pixel_values)
        prefix = self.cls_register_token.shape[0]
        heights, widths = image_grid_hw.unbind(-1)
        counts = heights * widths
        image, slot = _places_in_parts(counts + prefix, _patch_total(image_grid_hw) + prefix * image_grid_hw.shape[0])
        patch = (slot - prefix).clamp(min=0)  # the prefix's slots read patch 0 of their image, then the prefix
        side = torch.maximum(heights, widths)[image]
        table = self.position_embedding.reshape(self.max_rows, self.max_cols, -1)
        positions = _resized(table.float(), side, patch // widths[image], side, patch % widths[image], antialias=False)
        embedded = patches[_starts(counts)[image] + patch] + positions.to(patches.dtype)
        tokens = self.cls_register_token[slot.clamp(max=prefix - 1)]
        return torch.where((slot < prefix)[:, None], tokens, embedded).unsqueeze(0)

    return _embed_packed_patches


@register_patch("dynamo", "transformers.models.nemotron_h_omni.modeling_nemotron_h_omni.NemotronH_Omni_Reasoning_V3"
                            ".get_image_features", reports=True)
def _patch_nemotron_h_omni_images_shuffled_at_once(original):
    """Nemotron-H Omni pixel-shuffles each image's features (every 2 x 2 block of patches into one token) image by
    image over `image_grid_hw.tolist()`: it fixes the image count. The shuffle lays out each block's patches in their
    row-major order: every block at once instead, gathered."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.utils.generic import can_return_tuple

    def get_image_features(self, pixel_values, image_grid_hw, **kwargs):
        if self.config.downsample_ratio != 0.5 or _geometry_baked(image_grid_hw):
            return inspect.unwrap(original)(self, pixel_values, image_grid_hw, **kwargs)
        report_applied()
        torch._check_tensor_all(image_grid_hw.prod(-1).sum() == pixel_values.shape[0],
                                lambda: "`pixel_values` and `image_grid_hw` count different patches")
        outputs = self.vision_model(pixel_values.to(self.vision_model.config.torch_dtype),
                                    image_grid_hw=image_grid_hw, **kwargs)
        features = outputs.features
        if self.vision_final_layernorm is not None:
            features = self.vision_final_layernorm(features)
        heights, widths = image_grid_hw.unbind(-1)
        blocks = image_grid_hw // 2
        image, block = _places_in_parts(blocks.prod(-1), _patch_total(blocks))
        block_columns = blocks[image, 1]
        first = _starts(heights * widths)
        source = first[image][:, None, None] + _block_patches(block // block_columns, block % block_columns,
                                                              widths[image], 2)
        projected = self.multi_modal_projector(features[source].flatten(1))
        return BaseModelOutputWithPooling(last_hidden_state=outputs.last_hidden_state, pooler_output=(projected,),
                                          hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    return can_return_tuple(get_image_features)


@register_patch("dynamo", "transformers.models.lfm3_vl.modeling_lfm3_vl.Lfm3VlVisionShortConv.forward", reports=True)
def _patch_lfm3_vl_convolution_by_neighbours(original):
    """LFM3-VL's vision layers convolve each frame on its own grid, in a loop over the grid's `.tolist()`: it fixes the
    image count. Every patch at once instead: for each tap of the depthwise kernel, the neighbour patch at that
    offset in its frame (zero outside it), found in the merge-block layout, weighted and summed."""

    def forward(self, hidden_states, grid_thw, **kwargs):
        if not isinstance(grid_thw, _WholeSplit):
            return original(self, hidden_states, grid_thw, **kwargs)
        report_applied()
        input_gate, output_gate, conv_input = self.in_proj(hidden_states).chunk(3, dim=-1)
        gated = input_gate * conv_input
        merge, conv = self.spatial_merge_size, self.spatial_conv
        _, start, rows, columns, row, column = _merged_patch_places(grid_thw.tensor, merge, gated.shape[0])
        size, pad = conv.kernel_size[0], conv.padding[0]
        convolved = gated.new_zeros(gated.shape) + (0 if conv.bias is None else conv.bias)
        for tap_row in range(size):
            for tap_column in range(size):
                near_row, near_column = row + tap_row - pad, column + tap_column - pad
                inside = (near_row >= 0) & (near_row < rows) & (near_column >= 0) & (near_column < columns)
                near_row = torch.minimum(near_row.clamp(min=0), rows - 1)
                near_column = torch.minimum(near_column.clamp(min=0), columns - 1)
                block = near_row // merge * (columns // merge) + near_column // merge
                near = start + block * merge * merge + near_row % merge * merge + near_column % merge
                convolved = convolved + gated[near] * inside[:, None] * conv.weight[:, 0, tap_row, tap_column]
        return self.out_proj(output_gate * convolved)

    return forward


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings")
def _patch_udop_patches_as_fixed_rows(original):
    """UDOP adds to each token the image patch under its box centre, then appends the patches no token landed on,
    picked sample by sample with a boolean mask and zero-padded to the patch count: sizes that depend on the boxes'
    values. Sorting the patches free ones first (each keeps its index as its key) picks the same patches in the
    same order, and zeros the rest, at the fixed size the padding gives anyway."""

    def combine(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask=None, num_patches=14, max_len=0,
                image_size=224, patch_size=16):
        if max_len != 0:  # padded to another length than the patch count
            return original(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask, num_patches, max_len,
                            image_size, patch_size)

        def centre(low, high):  # the patch column (or row) of each token's box centre
            return ((bbox[:, :, low] + bbox[:, :, high]) / 2.0 * num_patches).floor().long().clip(0, num_patches - 1)

        landed = centre(0, 2) + centre(1, 3) * num_patches
        bbox = bbox.to(torch.float32 if bbox.device.type == "mps" else torch.float64)
        no_box = ((bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0))[..., None]
        under = image_embeddings.gather(1, landed[..., None].expand(-1, -1, image_embeddings.size(-1)))
        inputs_embeds += torch.where(no_box, torch.zeros_like(under), under)

        free = torch.ones(image_embeddings.shape[:2], dtype=torch.bool, device=image_embeddings.device)
        free = free.scatter(1, landed, False)
        position = torch.arange(free.size(1), device=free.device)
        order = torch.argsort(torch.where(free, position, position + free.size(1)), dim=1)  # free ones first
        in_use = free.gather(1, order)[..., None]

        def free_rows(rows):
            picked = rows.gather(1, order[..., None].expand(-1, -1, rows.size(-1)))
            return torch.where(in_use, picked, torch.zeros_like(picked))

        if visual_bbox is None:
            visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size).to(image_embeddings.device)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(image_embeddings.size(0), 1, 1)
        inputs_embeds = torch.cat([inputs_embeds, free_rows(image_embeddings)], 1)
        bbox = torch.cat([bbox, free_rows(visual_bbox)], 1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, in_use[..., 0].to(attention_mask.dtype)], 1)
        return inputs_embeds, bbox, attention_mask

    get_visual_bbox = importlib.import_module(original.__module__).get_visual_bbox
    return combine


@register_patch(
    "dynamo",
    "transformers.models.longformer.modeling_longformer.LongformerSelfAttention.forward",
    "transformers.models.led.modeling_led.LEDEncoderSelfAttention.forward",
)
def _patch_longformer_attention_dense(original):
    """Longformer (and LED's encoder) gathers its global tokens with `nonzero()` into a list as long as the most
    global tokens in the batch, and takes that path on `any().item()`: sizes and a branch read from tensor values.
    The same attention written densely over the whole sequence, with masks where the original gathers: a local query
    sees its window (`|i - j| <= w`, neither padding nor global keys there) and every global key once, by its own
    projections; a global query sees every unpadded key by the global projections. Without global tokens the
    global terms are masked out, so one trace serves both branches."""

    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        if output_attentions:  # the attention maps in the original's banded layout
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                            is_global_attn, output_attentions)
        batch, length, _ = hidden_states.shape
        lowest = torch.finfo(hidden_states.dtype).min

        def heads(vectors):  # (batch, heads, length, head_dim)
            return vectors.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        def attend(query, key, value, allowed):
            scores = torch.matmul(query / math.sqrt(self.head_dim), key.transpose(-1, -2))
            scores = scores.masked_fill(~allowed, lowest)
            probabilities = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
            return torch.matmul(probabilities, value)

        positions = torch.arange(length, device=hidden_states.device)
        in_window = (positions[:, None] - positions[None, :]).abs() <= self.one_sided_attn_window_size
        is_global = is_index_global_attn[:, None, None, :]
        local_key = (attention_mask == 0)[:, None, None, :]
        local = attend(heads(self.query(hidden_states)), heads(self.key(hidden_states)),
                       heads(self.value(hidden_states)), (in_window & local_key) | is_global)
        unpadded = ~is_index_masked[:, None, None, :]
        global_ = attend(heads(self.query_global(hidden_states)), heads(self.key_global(hidden_states)),
                         heads(self.value_global(hidden_states)), unpadded.expand(-1, -1, length, -1))
        output = torch.where(is_index_global_attn[:, None, :, None], global_, local)
        output = output.masked_fill(is_index_masked[:, None, :, None], 0.0)  # padding queries: zeros, as the original
        return (output.transpose(1, 2).reshape(batch, length, self.embed_dim),)

    return forward


@contextmanager
def _seeded_rotations(seed):
    """With a hash seed, Reformer seeds the global generator (`torch.manual_seed`) before drawing its rotations: a
    side effect a trace does not record, so the program would draw new ones each run. The seeded draw, made while
    tracing, is a constant of the program instead."""
    if seed is None:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    draw = torch.randn

    def seeded_draw(*shape, **kwargs):
        with unset_fake_temporarily(), disable_proxy_modes_tracing():
            return draw(*shape, generator=torch.Generator().manual_seed(seed), **kwargs)

    torch.randn = seeded_draw
    try:
        yield
    finally:
        torch.randn = draw


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.AxialPositionEmbeddings.forward")
def _patch_reformer_axial_positions_gathered(original):
    """At inference Reformer cuts its axial table to the rows its largest position id needs (`.item()`), then looks
    up each sample's positions in a Python loop over the batch, which fixed the batch. The rows cut away are never
    looked up: one gather from the whole table is the same."""

    def forward(self, position_ids):
        if self.training:
            return original(self, position_ids)
        rows, columns = self.axial_pos_shape
        table = torch.cat([weight.expand(rows, columns, weight.shape[-1]) for weight in self.weights], dim=-1)
        return table.reshape(rows * columns, -1)[position_ids]

    return forward


def _padded_along_sequence(tensor, padded_length, filler):
    """``tensor`` (batch, length, ...) padded with ``filler`` to ``padded_length``: written over a filled tensor, so
    that no tensor is as long as the padding alone, whose length of 1 the trace would guard on."""
    result = filler.expand(tensor.shape[0], padded_length, *tensor.shape[2:]).clone()
    result[:, : tensor.shape[1]] = tensor
    return result


@register_patch("dynamo", "transformers.models.led.modeling_led.LEDEncoder._pad_to_window_size")
def _patch_led_pads_at_least_one_token(original):
    """LED pads its input to a multiple of the attention window only when it is not one (`if padding_len > 0`, and
    unpads likewise): on a dynamic length the trace keeps one branch and guards on the length's remainder. Padding
    by 1 to `window` tokens instead (a whole masked window when the length is a multiple) takes one branch for
    every length; padded tokens are masked keys and are cut from the output, so the real tokens see the same."""

    def _pad_to_window_size(self, input_ids, attention_mask, inputs_embeds, pad_token_id):
        window = self.config.attention_window
        window = window if isinstance(window, int) else max(window)
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        padded_length = (length // window + 1) * window
        if input_ids is not None:
            input_ids = _padded_along_sequence(input_ids, padded_length, input_ids.new_tensor(pad_token_id))
        if inputs_embeds is not None:
            pad_embedding = self.embed_tokens(torch.tensor(self.config.pad_token_id, device=inputs_embeds.device))
            inputs_embeds = _padded_along_sequence(inputs_embeds, padded_length, pad_embedding.to(inputs_embeds.dtype))
        attention_mask = _padded_along_sequence(attention_mask, padded_length, attention_mask.new_tensor(False))
        return padded_length - length, input_ids, attention_mask, inputs_embeds

    return _pad_to_window_size


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.ReformerModel._pad_to_mult_of_chunk_length")
def _patch_reformer_padding_written_over(original):
    """Reformer pads its tokens to a multiple of its chunk length by concatenating a tensor as long as the padding,
    whose length of 1 the trace fixed (and with it the length's remainder)."""

    def _pad_to_mult_of_chunk_length(self, input_ids, inputs_embeds=None, attention_mask=None, position_ids=None,
                                     input_shape=None, padding_length=None, padded_seq_length=None, device=None):
        if position_ids is not None:
            return original(self, input_ids, inputs_embeds, attention_mask, position_ids, input_shape, padding_length,
                            padded_seq_length, device)
        length = input_shape[-1]
        padded_length = length + padding_length
        if attention_mask is None:
            attention_mask = torch.ones(input_shape, device=device, dtype=torch.bool)
        attention_mask = _padded_along_sequence(attention_mask, padded_length, attention_mask.new_tensor(0))
        if input_ids is not None:
            input_ids = _padded_along_sequence(input_ids, padded_length, input_ids.new_tensor(self.config.pad_token_id))
            input_shape = input_ids.size()
        if inputs_embeds is not None:
            pad_embedding = self.get_input_embeddings()(torch.tensor(self.config.pad_token_id, device=device))
            inputs_embeds = _padded_along_sequence(inputs_embeds, padded_length, pad_embedding)
            input_shape = inputs_embeds.size()[:-1]
        return input_ids, inputs_embeds, attention_mask, position_ids, input_shape

    return _pad_to_mult_of_chunk_length


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.LSHSelfAttention._hash_vectors")
def _patch_reformer_padding_bucket_as_tensors(original):
    """Reformer's LSH attention adds a bucket for padding tokens when `attention_mask.sum().item()` shows padding, a
    branch on tensor values. Both branches in tensor arithmetic: the buckets hashed without the mask, padding tokens
    moved to the extra bucket, and each hashing round offset by the bucket count its branch would have used."""

    def _hash_vectors(self, vectors, num_hashes, attention_mask, increase_num_buckets=False):
        if attention_mask is None:
            return original(self, vectors, num_hashes, attention_mask, increase_num_buckets)
        batch, length = attention_mask.shape
        num_buckets = self.num_buckets if isinstance(self.num_buckets, int) else math.prod(self.num_buckets)
        rounds = torch.arange(num_hashes, device=vectors.device).view(1, 1, -1, 1)
        with _seeded_rotations(self.hash_seed):
            hashed = original(self, vectors, num_hashes, None)
        hashed = hashed.view(batch, self.num_attention_heads, num_hashes, length)
        real = attention_mask.to(torch.bool)[:, None, None, :]
        buckets = torch.where(real, hashed - rounds * num_buckets, num_buckets)
        padded = (~real).any() if not increase_num_buckets else torch.tensor(True, device=vectors.device)
        return (buckets + rounds * (num_buckets + padded.long())).flatten(start_dim=2, end_dim=3)

    return _hash_vectors


@register_patch("dynamo", "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds")
def _patch_funnel_positions_by_their_ends(original):
    """Funnel's relative-shift attention lists every token position in Python (`list(range(seq_len))`) and pools
    the list block by block, which fixes the sequence length in the trace. Its relative distances read only the
    first and last positions and the count of each list: those, kept as numbers, give the same distances for any
    length. A list is (first, second, step, count): its first position, then an arithmetic run from the second."""

    def get_position_embeds(self, seq_len, dtype, device):
        if self.config.attention_type == "factorized":
            return original(self, seq_len, dtype, device)
        d_model = self.config.d_model
        inv_freq = 1 / (10000 ** (torch.arange(0, d_model // 2, dtype=torch.int64, device=device).to(dtype)
                                  / (d_model // 2)))
        zero_offset = seq_len * 2
        relative = torch.arange(-seq_len * 2, seq_len * 2, dtype=torch.int64, device=device).to(dtype)
        sinusoid = relative[:, None] * inv_freq[None]
        pos_embed = torch.cat([self.sin_dropout(torch.sin(sinusoid)), self.cos_dropout(torch.cos(sinusoid))], dim=-1)

        def last(positions):
            first, second, step, count = positions
            return first if count == 1 else second + (count - 2) * step

        def pooled(positions, block_index):  # `stride_pool_pos`
            first, second, step, count = positions
            if not self.config.separate_cls:
                return first, first + 2 * step, 2 * step, (count + 1) // 2
            kept = count - 2 if self.config.truncate_seq else count - 1
            return 1 - 2**block_index, second, 2 * step, 1 + (kept + 1) // 2

        def distances(positions, stride, pooled_positions, shift):  # `relative_pos`
            top = pooled_positions[0] - positions[0] + shift * pooled_positions[3] * stride
            bottom = pooled_positions[0] - last(positions)
            rows = torch.arange(top, bottom - 1, -stride, dtype=torch.long, device=device)
            return torch.gather(pos_embed, 0, (rows[:, None] + zero_offset).expand(rows.size(0), d_model))

        positions = (0, 1, 1, seq_len)
        embeds = []
        for block_index in range(self.config.num_blocks):
            between = None
            if block_index > 0:
                pooled_positions = pooled(positions, block_index)
                between = distances(positions, 2 ** (block_index - 1), pooled_positions, shift=2)
                positions = pooled_positions
            embeds.append([distances(positions, 2**block_index, positions, shift=1), between])
        return embeds

    return get_position_embeds


@register_patch("dynamo", "transformers.models.hunyuan_vl.modeling_hunyuan_vl.HunYuanVLModel.get_placeholder_mask")
def _patch_hunyuan_vl_placeholder_check_as_tensor(original):
    """HunYuan-VL compares its placeholder count with its image features by a Python `if` on the size of a
    boolean selection, a branch on tensor values. The same check as a tensor condition, as transformers' other
    vision-language models make it (`torch._check_tensor_all`)."""

    def get_placeholder_mask(self, input_ids, inputs_embeds, image_features=None):
        mask = original(self, input_ids, inputs_embeds)
        if image_features is not None:
            torch._check_tensor_all(mask.sum() == image_features.numel(),
                                    lambda: "Image features and image tokens do not match")
        return mask

    return get_placeholder_mask


@register_patch("dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel"
                            ".get_image_grids_for_generation", reports=True)
def _patch_glm_image_source_grids_by_mask(original):
    """GLM-Image drops each sample's last grid (the image it generates) by splitting the grids by
    `images_per_sample.tolist()`: it fixes the sample and image counts. The same rows kept by one mask."""

    def get_image_grids_for_generation(self, images_per_sample, image_grid_thw):
        if images_per_sample is None or _geometry_baked(images_per_sample):
            return original(self, images_per_sample, image_grid_thw)
        report_applied()
        last = images_per_sample.cumsum(0) - 1
        row = torch.arange(image_grid_thw.shape[0], device=image_grid_thw.device)
        return image_grid_thw[~(row[:, None] == last).any(-1)]

    return get_image_grids_for_generation


@register_patch("dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel.get_image_features",
                reports=True)
def _patch_glm_image_features_as_one_map(original):
    """GLM-Image lays each image's features out as its own map, split by `.tolist()` sizes, and its VQ tokenizer
    runs on each map in turn: the image count is fixed. The tokenizer works cell by cell (a 1x1 convolution, then
    the nearest code): every image's cells, in the same order, as one map of one row."""
    from transformers.utils.generic import accepts_precomputed_kwargs, can_return_tuple

    def get_image_features(self, pixel_values, image_grid_thw=None, images_per_sample=None, **kwargs):
        baked = not isinstance(image_grid_thw, torch.Tensor) or _geometry_baked(image_grid_thw)
        if baked or images_per_sample is not None:
            return inspect.unwrap(original)(self, pixel_values, image_grid_thw, images_per_sample, **kwargs)
        report_applied()
        torch._check_tensor_all((image_grid_thw[:, 0] == 1).all(), lambda: "GLM-Image's maps are of one frame")
        outputs = self.visual(pixel_values.type(self.visual.dtype), grid_thw=image_grid_thw, return_dict=True,
                              **kwargs)
        outputs.pooler_output = outputs.pooler_output.T[None, :, None]  # (1, channels, 1, cells)
        return outputs

    return accepts_precomputed_kwargs(modality="image")(can_return_tuple(get_image_features))


@register_patch("dynamo", "transformers.models.glm_image.modeling_glm_image.GlmImageModel.get_placeholder_mask")
def _patch_glm_image_placeholder_check_as_tensor(_original):
    """GLM-Image checks its placeholder count against its image tokens with a Python `if` on a tensor's value, as
    HunYuan-VL does (see `_patch_hunyuan_vl_placeholder_check_as_tensor`): the same check as a tensor condition."""

    def get_placeholder_mask(self, input_ids, image_ids):
        mask = input_ids == self.config.image_token_id
        torch._check_tensor_all(mask.sum() == image_ids.shape[0],
                                lambda: "Number of image placeholder tokens does not match the image tokens")
        return mask

    return get_placeholder_mask


@register_patch(
    "dynamo",
    "transformers.models.voxtral.modeling_voxtral.VoxtralModel.get_placeholder_mask",
    "transformers.models.inkling.modeling_inkling.InklingModel.get_placeholder_mask",
    "transformers.models.inkling2.modeling_inkling2.Inkling2Model.get_placeholder_mask",
    reports=True,
)
def _patch_placeholder_count_checked_by_sum(original):
    """Voxtral and Inkling (1 and 2) check their placeholders against their features by the size of a boolean selection:
    with a symbolic batch, equating that data-dependent size with the features' size trips torch's range
    bookkeeping ("not a subset of src_bound"). The count of placeholders times the width is that size: the same
    check as a tensor condition, as in `_patch_hunyuan_vl_placeholder_check_as_tensor`."""

    def get_placeholder_mask(self, input_ids, inputs_embeds, *args, **kwargs):
        if input_ids is None:  # placeholders found by their embedding: no selection to size
            return original(self, input_ids, inputs_embeds, *args, **kwargs)
        report_applied()
        # Voxtral's (audio_features) and Inkling's (features, token_id), by position or by name
        features = kwargs.get("audio_features", kwargs.get("features", args[0] if args else None))
        token = kwargs.get("token_id", args[1] if len(args) > 1 else self.config.audio_token_id)
        mask = input_ids == token
        torch._check_tensor_all(mask.sum() * inputs_embeds.shape[-1] == features.numel(),
                                lambda: "Multimodal features and placeholder tokens do not match")
        return mask.unsqueeze(-1).expand_as(inputs_embeds)

    return get_placeholder_mask


@register_patch(
    "dynamo",
    "transformers.models.encodec.modeling_encodec.EncodecConv1d.forward",
    "transformers.models.mimi.modeling_mimi.MimiConv1d.forward",
    "transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer"
    ".PocketTTSAudioTokenizerConv1d.forward",
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


@register_patch("dynamo", "torch.distributions.categorical.Categorical.__init__")
def _patch_categorical_unvalidated(original):
    """A distribution validates its parameters with `if not constraint.check(value).all()`, a branch on tensor
    values export cannot take (BLT's patcher: the entropy of its logits). The values are the model's own."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        original(self, probs, logits, validate_args=False)

    return __init__


_RIGID = "transformers.models.esm.openfold_utils.rigid_utils"


@register_patch("dynamo", f"{_RIGID}.identity_rot_mats", f"{_RIGID}.identity_trans", f"{_RIGID}.identity_quats")
def _patch_identity_frames_uncached(original):
    """ESMFold's structure module starts from identity frames made by functions cached on their shape: a symbolic
    shape cannot be a cache key, and a tensor cached by one trace would come back in the next. Made afresh."""
    return original.__wrapped__


_OMDET = "transformers.models.omdet_turbo.modeling_omdet_turbo"


@register_patch("dynamo", f"{_OMDET}.OmDetTurboForObjectDetection.get_language_embedding", reports=True)
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
        rows = (_starts(classes_structure)[None] + slots).clamp(max=classes.shape[0] - 1)
        class_embeddings = torch.where(inside[..., None], classes[rows], 0.0)
        return class_embeddings.to(self.device), tasks.to(self.device), task_mask.to(self.device)

    return get_language_embedding


@register_patch("dynamo", f"{_OMDET}.OmDetTurboLanguageBackbone.forward", reports=True)
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


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.length_regulator")
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


@register_patch("dynamo", "transformers.models.seamless_m4t.modeling_seamless_m4t.SeamlessM4TCodeHifiGan.forward")
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


@register_patch("dynamo", "transformers.models.ovis2.modeling_ovis2.Ovis2Model.forward")
def _patch_ovis2_visual_indicators_by_where(original):
    """Ovis2 writes its visual indicator features into the embeddings under `if mask.any()`, a branch on token
    values. The same rows chosen by `torch.where` before the forward, which then runs on those embeddings with no
    indicator ids left to look for."""

    def forward(self, input_ids=None, pixel_values=None, *args, mm_encoder_outputs=None, **kwargs):
        precomputed = mm_encoder_outputs is not None or kwargs.get("inputs_embeds") is not None
        if input_ids is None or pixel_values is None or precomputed or args:
            return original(self, input_ids, pixel_values, *args, mm_encoder_outputs=mm_encoder_outputs, **kwargs)
        kwargs.pop("inputs_embeds", None)
        image = self.get_image_features(pixel_values=pixel_values, return_dict=True)
        embeds = self.get_input_embeddings()(input_ids)
        for index, token_id in enumerate(self.visual_indicator_token_ids):
            feature = image.visual_indicator_features[index].to(embeds.dtype)
            embeds = torch.where((input_ids == token_id)[..., None], feature, embeds)
        indicator_ids, self.visual_indicator_token_ids = self.visual_indicator_token_ids, []
        try:
            return original(self, None, None, inputs_embeds=embeds, mm_encoder_outputs={"image": image}, **kwargs)
        finally:
            self.visual_indicator_token_ids = indicator_ids

    return forward


@register_patch("dynamo", "transformers.models.llama4.modeling_llama4.Llama4VisionRotaryEmbedding.forward")
def _patch_llama4_vision_rotary_as_pairs(_original):
    """Llama 4's vision tower keeps its 2-D rotary table as a complex buffer. The same table as real (cos, sin)
    pairs: patch columns then rows, counted from 1, and no rotation for the class token appended last."""

    def forward(self, hidden_states):
        config = self.config
        side = config.image_size // config.patch_size
        half = config.hidden_size // config.num_attention_heads // 2
        inv_freq = 1.0 / config.rope_parameters["rope_theta"] ** (torch.arange(0, half, 2)[: half // 2].float() / half)
        patch = torch.arange(side * side, device=hidden_states.device)
        grid = torch.stack((patch % side, patch // side), dim=-1) + 1
        angles = (grid[..., None].float() * inv_freq.to(hidden_states.device)).flatten(-2)
        angles = torch.cat([angles, angles.new_zeros(1, angles.shape[-1])])
        return torch.stack((angles.cos(), angles.sin()), dim=-1)[:, None]

    return forward


@register_patch("dynamo", "transformers.models.llama4.modeling_llama4.vision_apply_rotary_emb")
def _patch_llama4_vision_rotate_pairs(original):
    """The rotation half of `_patch_llama4_vision_rotary_as_pairs`: (batch, patches, heads, dim) queries."""

    def vision_apply_rotary_emb(query, key, freqs_ci):
        if freqs_ci.is_complex():  # the table's half is not installed
            return original(query, key, freqs_ci)
        table = freqs_ci.reshape(1, query.shape[1], 1, -1, 2)
        return _rotate_pairs(query, table), _rotate_pairs(key, table)

    return vision_apply_rotary_emb


@register_patch("dynamo", "transformers.models.vilt.modeling_vilt.ViltEmbeddings.visual_embed")
def _patch_vilt_patches_in_place(original):
    """ViLT gathers each image's patches in an order drawn at random (`multinomial`), pads short images with
    patches drawn from their padding, and resizes its position table to each image's extent read from the pixel
    mask: shapes from data, and random. Attention masks the padding and every patch carries its own position, so
    keeping all patches in place, the padding masked, gives eager's text and pooled states. Where the config keeps
    fewer patches than an image has, eager's subset is random: left to eager's code."""

    def visual_embed(self, pixel_values, pixel_mask, max_image_length=200):
        patches = self.patch_embeddings(pixel_values)
        batch_size, channels, height, width = patches.shape
        if isinstance(max_image_length, int) and 0 <= max_image_length < height * width:
            return original(self, pixel_values, pixel_mask, max_image_length)
        mask = torch.nn.functional.interpolate(pixel_mask[:, None].float(), size=(height, width)).long()[:, 0]
        rows, columns = mask.sum(dim=1)[:, 0], mask.sum(dim=2)[:, 0]
        side = self.config.image_size // self.config.patch_size
        table = self.position_embeddings[:, 1:].transpose(1, 2).reshape(1, channels, side, side)

        def grid_axis(count, length):  # `interpolate(align_corners=True)` to `count` places, in [-1, 1]
            places = torch.arange(length, device=patches.device)
            return places[None] * (2 / (count - 1).clamp(min=1))[:, None] - 1, places[None] < count[:, None]

        y, y_inside = grid_axis(rows, height)
        x, x_inside = grid_axis(columns, width)
        grid = torch.stack(torch.broadcast_tensors(x[:, None, :], y[:, :, None]), dim=-1)
        positions = torch.nn.functional.grid_sample(
            table.expand(batch_size, -1, -1, -1), grid.to(table.dtype), mode="bilinear", align_corners=True
        )
        positions = positions * (y_inside[:, :, None] & x_inside[:, None, :])[:, None]  # zero past each image
        patch_index = torch.stack(
            torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij"), dim=-1
        ).to(mask.device)
        embeddings = torch.cat((self.cls_token.expand(batch_size, -1, -1), patches.flatten(2).transpose(1, 2)), 1)
        first = self.position_embeddings[:, :1].expand(batch_size, -1, -1)
        embeddings = embeddings + torch.cat((first, positions.flatten(2).transpose(1, 2)), dim=1)
        mask = torch.cat((mask.new_ones(batch_size, 1), mask.flatten(1)), dim=1)
        return self.dropout(embeddings), mask, (patch_index.view(1, -1, 2).expand(batch_size, -1, -1), (height, width))

    return visual_embed


@register_patch("dynamo", "transformers.models.qwen4_exp.modeling_qwen4_exp.Qwen4ExpTextQSAIndexer.forward")
def _patch_qwen4_indexer_by_masks(original):
    """Qwen4-Exp's sparse-attention indexer loops over every row and query, lists the keys a query sees with
    `nonzero`, pools them into blocks of `compress_ratio` in that order, and keeps the best-scoring blocks and the
    incomplete tail: sizes read from data. The same selection over every key at once: a key's rank among the
    visible ones names its block, blocks a query cannot fill score -inf, and the best are scattered back. Between
    blocks that tie (a query whose scores are all zero, as a padding token's) topk picks by its own order, in eager
    as here, and that order depends on the vector's length."""
    rotate = importlib.import_module(original.__module__).apply_rotary_pos_emb

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values):
        batch_size, seq_length, _ = hidden_states.shape
        full_cos, full_sin = position_embeddings
        queries, keys = torch.split(
            self.index_qk_proj(hidden_states),
            [self.index_n_heads * self.index_head_dim, self.index_kv_heads * self.index_head_dim], dim=-1,
        )
        queries = self.q_layernorm(queries.reshape(batch_size, seq_length, -1, self.index_head_dim))
        queries = rotate(queries, cos=full_cos[:, -seq_length:], sin=full_sin[:, -seq_length:], unsqueeze_dim=2)
        keys = keys.reshape(batch_size, seq_length, -1, self.index_head_dim).squeeze(2)
        if past_key_values is not None:
            keys = past_key_values.update_indexer(keys, self.layer_idx)

        visible = (attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0)[:, 0]
        ratio, most = self.compress_ratio, max(visible.shape[-1] // self.compress_ratio, 1)
        rank = visible.long().cumsum(-1) - 1  # among the keys the query sees, in order
        filled = visible.sum(-1, keepdim=True) // ratio  # complete blocks per query
        pooled = visible & (rank < filled * ratio)
        block = torch.where(pooled, rank // ratio, most)
        member = torch.nn.functional.one_hot(block, most + 1)[..., :most].float()  # (batch, query, key, block)
        block_keys = self.k_layernorm((torch.einsum("bqkm,bkd->bqmd", member, keys.float()) / ratio).to(keys.dtype))
        first = member * (rank % ratio == 0)[..., None]  # each block rotated by its first key's position
        cos, sin = (torch.einsum("bqkm,bkd->bqmd", first, table.float()).to(table.dtype)
                    for table in (full_cos, full_sin))
        block_keys = rotate(block_keys.unsqueeze(3), cos=cos, sin=sin, unsqueeze_dim=3).squeeze(3)
        scores = torch.einsum("bqhd,bqmd->bqmh", queries.float(), block_keys.float()).relu().sum(-1)
        scores = scores / math.sqrt(self.index_head_dim)
        fillable = torch.arange(most, device=scores.device) < filled
        best = scores.masked_fill(~fillable, float("-inf")).topk(min(self.block_topk, most), dim=-1).indices
        chosen = torch.zeros_like(fillable).scatter(-1, best, fillable.gather(-1, best))
        kept = chosen.gather(-1, block.clamp(max=most - 1)) & pooled
        return (kept | (visible & ~pooled)).unsqueeze(1)

    return forward


@register_patch(
    "dynamo",
    "transformers.models.slanet.modeling_slanet.SLANetSLAHead.forward",
    "transformers.models.slanext.modeling_slanext.SLANeXtSLAHead.forward",
)
def _patch_table_decode_cut_after(original):
    """SLANet's table-structure head decodes greedily and stops once every row has emitted its end token: a
    Python `break` on tensor values. Each step reads only earlier ones, so every step is decoded and the output
    cut after the first at which every row has ended: a length read from data, bounded by the step count. The
    per-step states (`hidden_states`) are not returned."""
    from transformers.modeling_outputs import BaseModelOutput

    def forward(self, hidden_states, targets=None, **kwargs):
        config, batch = self.config, hidden_states.shape[0]
        features = hidden_states.new_zeros(batch, config.hidden_size, dtype=torch.float32)
        predicted = torch.zeros(batch, dtype=torch.long, device=hidden_states.device)
        steps, predictions = config.max_text_length + 1, []
        for _ in range(steps):
            embedded = torch.nn.functional.one_hot(predicted, config.out_channels).float()
            features, _ = self.structure_attention_cell(features, hidden_states.float(), embedded)
            step = self.structure_generator(features)
            predicted = step.argmax(dim=1)
            predictions.append((step, predicted))
        ends = torch.stack([ids for _, ids in predictions], dim=1).eq(config.out_channels - 1)
        every_row = (ends.long().cumsum(dim=1) > 0).all(dim=0)  # every row has ended by this step
        length = torch.where(every_row.any(), every_row.int().argmax() + 1, steps).item()
        torch._check(length >= 1)
        torch._check(length <= steps)
        structure = torch.stack([step for step, _ in predictions], dim=1)[:, :length]
        structure = torch.nn.functional.softmax(structure, dim=-1, dtype=torch.float32).to(hidden_states.dtype)
        return BaseModelOutput(last_hidden_state=structure)

    return forward


@register_patch(
    "dynamo",
    "transformers.models.qwen3_asr.modeling_qwen3_asr.get_audio_cu_seqlens",
    "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.get_audio_cu_seqlens",
)
def _patch_audio_windows_padded(original):
    """The Qwen audio towers cut each sample's frames into attention windows in a Python loop over lengths read
    from the mask: as many boundaries as the data makes. A window as long as the longest chunk's frames times the
    inference ratio, so a sample has at most one window per chunk of the batch: that many per sample, the ones past
    its frames empty. Empty windows add repeated boundaries, which split no window."""
    lengths_after_convolution = importlib.import_module(original.__module__)._get_feat_extract_output_lengths

    def get_audio_cu_seqlens(chunk_lengths, feature_lens, n_window_infer, n_window, kwargs=None):
        if kwargs is not None and (cu_seqlens := kwargs.pop("cu_seqlens", None)) is not None:
            return cu_seqlens
        lengths = lengths_after_convolution(feature_lens, n_window)
        window = lengths_after_convolution(chunk_lengths, n_window).max() * (n_window_infer // (n_window * 2))
        starts = torch.arange(chunk_lengths.shape[0], device=lengths.device) * window
        sizes = (lengths[:, None] - starts[None]).clamp(min=0).minimum(window)
        return torch.nn.functional.pad(sizes.flatten().cumsum(-1), (1, 0)).to(torch.int32)

    return get_audio_cu_seqlens


def _audio_chunks_on_a_grid(input_features, feature_attention_mask, chunk_width):
    """Each sample's kept frames, in order, cut into chunks of `chunk_width` on a grid of as many chunks per sample
    as the padded frames make: `(samples * chunks, bins, chunk_width)`, zeros past a sample's frames, and each
    chunk's frame count (0 for a chunk past them)."""
    samples, bins, frames = input_features.shape
    chunks = (frames + chunk_width - 1) // chunk_width
    kept = feature_attention_mask != 0
    # a kept frame's place among its sample's kept frames; dropped frames go to one spare column, cut after
    place = torch.where(kept, kept.long().cumsum(1) - 1, chunks * chunk_width)
    grid = input_features.new_zeros(samples, bins, chunks * chunk_width + 1)
    grid = grid.scatter(2, place[:, None, :].expand(-1, bins, -1), input_features)[..., :-1]
    grid = grid.view(samples, bins, chunks, chunk_width).transpose(1, 2).reshape(-1, bins, chunk_width)
    chunk_starts = torch.arange(chunks, device=kept.device) * chunk_width
    chunk_lengths = (kept.sum(1)[:, None] - chunk_starts).clamp(0, chunk_width).flatten()
    return grid, chunk_lengths


@register_patch(
    "dynamo",
    "transformers.models.qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniThinkerModel.get_audio_features",
    "transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoeThinkerModel.get_audio_features",
    reports=True,
)
def _patch_omni_audio_chunks_on_a_grid(original):
    """The Qwen Omni thinkers gather every kept audio frame into one row and split it into chunks by sizes read
    with `.tolist()`: the chunk count is data, and Qwen3-Omni's convolution then walks those chunks in groups. Its
    audio tower takes the chunks precomputed: laid on a grid of as many per sample as the padded frames make
    (`_audio_chunks_on_a_grid`), a chunk past a sample's frames holds none, adds no valid position and an empty
    attention window. The valid positions are then counted on the grid's width, not the longest chunk's."""
    from transformers.utils.generic import accepts_precomputed_kwargs, can_return_tuple

    module = importlib.import_module(original.__module__)
    qwen3 = original.__module__.endswith(".modeling_qwen3_omni_moe")
    convolutions = 3 if qwen3 else 1  # of stride 2, over each chunk

    def lengths_after_convolution(lengths, n_window):
        if qwen3:
            return module._get_feat_extract_output_lengths(lengths, n_window)
        return (lengths - 1) // 2 + 1

    def get_audio_features(self, input_features, feature_attention_mask=None, audio_feature_lengths=None, **kwargs):
        if feature_attention_mask is None or "padded_feature" in kwargs:
            return inspect.unwrap(original)(self, input_features, feature_attention_mask, audio_feature_lengths,
                                            **kwargs)
        report_applied()
        n_window = self.audio_tower.n_window
        chunk_width = 2 * n_window
        padded_feature, chunk_lengths = _audio_chunks_on_a_grid(input_features, feature_attention_mask, chunk_width)
        width = chunk_width  # not Qwen3's length formula: it counts 13 per whole chunk whatever the window
        for _ in range(convolutions):
            width = (width - 1) // 2 + 1
        positions = torch.arange(width, device=chunk_lengths.device)
        valid = positions < lengths_after_convolution(chunk_lengths, n_window)[:, None]
        feature_lens = feature_attention_mask.sum(1)
        if not qwen3:  # Qwen2.5-Omni averages each sample's positions in pairs; eager slices `[:-1]` of the batch
            def pairs_of(frames):
                return (lengths_after_convolution(frames, n_window) - 2) // 2 + 1

            pairs = pairs_of(feature_lens)
            total = pairs.sum().item()
            # at most every sample's frames kept: a bound ExecuTorch can plan memory for
            samples, frames = feature_attention_mask.shape
            torch._check(total <= samples * pairs_of(frames))
            sample_positions = lengths_after_convolution(feature_lens, n_window)
            sample, pair = _places_in_parts(pairs, total)
            kwargs["pool_indices"] = _starts(sample_positions)[sample] + 2 * pair
        return self.audio_tower(
            None, feature_lens=feature_lens, padded_feature=padded_feature, chunk_lengths=chunk_lengths,
            valid_indices=valid.flatten().nonzero().squeeze(-1), return_dict=True, **kwargs)

    return accepts_precomputed_kwargs(modality="audio")(can_return_tuple(get_audio_features))


@register_patch(
    "dynamo",
    "transformers.models.sam3.modeling_sam3.Sam3DetrDecoder.forward",
    "transformers.models.sam3_lite_text.modeling_sam3_lite_text.Sam3LiteTextDetrDecoder.forward",
    reports=True,
)
def _patch_sam3_box_bias_on_the_token_grid(original):
    """SAM 3's DETR decoder lays each query's box bias over the vision tokens on a grid whose height and width it
    reads back from the `spatial_shapes` tensor, once per layer: values read from data, whose product the trace
    cannot match to the token count the bias is added to. Read once, checked against that count, and handed to
    the bias as sizes."""

    def forward(self, vision_features, *args, spatial_shapes=None, **kwargs):
        if not isinstance(spatial_shapes, torch.Tensor) or spatial_shapes.shape[0] != 1:
            return original(self, vision_features, *args, spatial_shapes=spatial_shapes, **kwargs)
        report_applied()
        height, width = spatial_shapes[0].tolist()
        torch._check(height * width == vision_features.shape[1])
        for side in (height, width):  # bounds ExecuTorch plans the bias for
            torch._check(side >= 1)
            torch._check(side <= vision_features.shape[1])
        box_bias = type(self)._get_rpb_matrix
        self._get_rpb_matrix = lambda boxes, _grid: box_bias(self, boxes, (height, width))
        try:
            return original(self, vision_features, *args, spatial_shapes=spatial_shapes, **kwargs)
        finally:
            del self._get_rpb_matrix

    return forward


_PHI4_AUDIO = "transformers.models.phi4_multimodal.modeling_phi4_multimodal"


@register_patch("dynamo", f"{_PHI4_AUDIO}.adaptive_enc_mask", f"{_PHI4_AUDIO}.Phi4MultimodalAudioModel._streaming_mask")
def _patch_streaming_mask_by_argmax(original):
    """Phi-4's audio conformer finds each frame's chunk with `nonzero()` over a frame-by-chunk table in which every
    row holds exactly one True: a count the trace cannot know. The first True of each row is the same chunk. The
    chunk starts come from `np.arange` over the frame count, which a symbolic count cannot feed: `torch.arange`."""

    def adaptive_enc_mask(x_len, chunk_start_idx, left_window=0, right_window=0):
        starts = torch.as_tensor(chunk_start_idx).long()
        start_pad = torch.nn.functional.pad(starts, (1, 0))
        end_pad = torch.nn.functional.pad(starts, (0, 1), value=x_len)
        frames = torch.arange(0, x_len)
        chunk = ((frames[:, None] < end_pad) & (frames[:, None] >= start_pad)).int().argmax(dim=-1)
        left = start_pad[(chunk - left_window).clamp(min=0)]
        right = end_pad[(chunk + right_window).clamp(max=len(starts))]
        return (frames[None] >= left[:, None]) & (frames[None] < right[:, None])

    def _streaming_mask(self, seq_len, batch_size, chunk_size, left_chunk):
        if self.training:  # chunks drawn at random
            return original(self, seq_len, batch_size, chunk_size, left_chunk)
        starts = torch.arange(0, seq_len, chunk_size) if chunk_size > 0 else torch.zeros(0)  # -1: one chunk
        mask = adaptive_enc_mask(seq_len, starts, left_window=left_chunk)
        return mask.unsqueeze(0).expand([batch_size, -1, -1])

    return {"adaptive_enc_mask": adaptive_enc_mask, "_streaming_mask": _streaming_mask}[original.__name__]


@register_patch("dynamo", "transformers.models.canine.modeling_canine.CanineAttention.forward", reports=True)
def _patch_canine_local_attention_masked(original):
    """CANINE's local attention cuts the characters into windows with a Python loop over the sequence length, which
    fixes the length. With windows as wide as their stride (as CANINE builds them) the queries of window k read the
    keys of window k: one attention over the whole sequence whose mask leaves out every other key gives the same
    numbers (outside keys weigh exp(-inf), the padding keys inside weigh as in the window). The always-attended
    first key is a column of its own, as the windows repeat it."""

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        windows = {self.attend_from_chunk_width, self.attend_from_chunk_stride,
                   self.attend_to_chunk_width, self.attend_to_chunk_stride}  # fmt: skip
        if not self.local or output_attentions or self.first_position_attends_to_all or len(windows) != 1:
            return original(self, hidden_states, attention_mask, output_attentions)
        report_applied()
        (width,) = windows
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        in_window = (positions[:, None] // width) == (positions[None, :] // width)
        keys, padding = hidden_states, attention_mask
        if self.always_attend_to_first_position:
            keys = torch.cat([hidden_states[:, :1], hidden_states], dim=1)
            in_window = torch.cat([torch.ones_like(in_window[:, :1]), in_window], dim=1)
            padding = torch.cat([attention_mask[:, :, :1], attention_mask], dim=2)
        # the padding as the windows add it; keys outside the query's window weigh nothing, even beside padding
        additive = (1.0 - padding.float()) * torch.finfo(hidden_states.dtype).min
        additive = additive.masked_fill(~in_window, float("-inf"))
        attended = self.self(hidden_states, keys, additive.unsqueeze(1).to(hidden_states.dtype))[0]
        return (self.output(attended, hidden_states),)

    return forward


@register_patch("dynamo", "torch.nn.functional.max_pool1d", reports=True)
def _patch_max_pool1d_by_windows(original):
    """The 1-D max-pooling kernel reads the sequence length as an int, so a symbolic length gets fixed (CANINE pools
    its character mask into molecules with it). Windows that tile the sequence (stride = kernel, no padding) are a
    reshape and a maximum, for any length; a last partial window is dropped, as the kernel drops it."""

    def first(value):
        return value[0] if isinstance(value, (tuple, list)) else value

    def max_pool1d(input, kernel_size, stride=None, padding=0, *args, **kwargs):
        options = {**dict(zip(("dilation", "ceil_mode", "return_indices"), args)), **kwargs}
        kernel = first(kernel_size)
        stride = kernel if stride is None or stride == [] else first(stride)
        tiled = stride == kernel and first(padding) == 0 and first(options.get("dilation", 1)) == 1
        tiled = tiled and not options.get("ceil_mode") and not options.get("return_indices")
        if not tiled or not isinstance(input.shape[-1], torch.SymInt):
            return original(input, kernel_size, stride, padding, *args, **kwargs)
        report_applied()
        windows = input.shape[-1] // kernel
        # the tiled steps gathered, not sliced: a slice would guard on whether a window is left over
        steps = torch.arange(windows * kernel, device=input.device)
        return input.index_select(-1, steps).unflatten(-1, (windows, kernel)).amax(dim=-1)

    return max_pool1d


@register_patch(
    "dynamo",
    *(f"transformers.models.{name}.modeling_{name}.mamba_selective_scan"
      for name in ("mamba", "falcon_mamba", "jamba", "zamba")),
    reports=True,
)
def _patch_selective_scan_as_scan_op(original):
    """Without their CUDA kernels, Mamba's selective scans loop over the time steps in Python: a symbolic sequence
    length cannot drive that loop, so the export fixes it. torch's `scan` operator carries the state through the
    same steps in the same order, for any length. A fixed length keeps the loop."""
    from torch._higher_order_ops.scan import scan

    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):  # fmt: skip
        if not isinstance(hidden_states.shape[2], torch.SymInt):
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                            return_last_state=return_last_state, **kwargs)  # fmt: skip
        report_applied()
        if delta_bias is not None:
            dt = dt + delta_bias.to(dt.dtype)[..., None]
        if delta_softplus:
            dt = torch.nn.functional.softplus(dt)
        # per time step (axis 0): the state's decay, its update, and the readout of the state
        decay = torch.exp(A[None, :, None, :] * dt[:, :, :, None]).movedim(2, 0)
        update = dt[:, :, :, None] * B.transpose(1, 2)[:, None].float() * hidden_states[:, :, :, None].float()
        update = update.movedim(2, 0)
        readout = C.movedim(2, 0)  # B and C come as (batch, state, time)

        def step(state, inputs):
            step_decay, step_update, step_readout = inputs
            state = step_decay * state + step_update
            return state, (state.to(hidden_states.dtype) * step_readout[:, None, :]).sum(-1)

        last_state, outputs = scan(step, torch.zeros_like(update[0]), (decay, update, readout))
        scan_output = outputs.movedim(0, -1)
        if D is not None:
            scan_output = scan_output + hidden_states * D[None, :, None]
        if z is not None:
            scan_output = scan_output * torch.nn.functional.silu(z)
        return (scan_output, last_state) if return_last_state else scan_output

    return mamba_selective_scan


@register_patch("dynamo", "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan",
                reports=True)
def _patch_rg_lru_scan_as_scan_op(original):
    """RecurrentGemma's linear recurrence loops over the time steps in Python, as Mamba's scans do (see
    `_patch_selective_scan_as_scan_op`): `scan` runs the same steps for a symbolic length."""
    from torch._higher_order_ops.scan import scan

    def _rnn_scan(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype=torch.float32):
        if not isinstance(hidden_states.shape[1], torch.SymInt):
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        report_applied()
        recurrent_gate = recurrent_gate * ~reset
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)

        def step(state, inputs):
            gate, update = inputs
            state = gate.type(acc_dtype) * state + update.type(acc_dtype)
            return state, state.to(hidden_states.dtype, copy=True)  # the carry and the output must not alias

        last_state, outputs = scan(step, recurrent_states, (recurrent_gate.movedim(1, 0), hidden_states.movedim(1, 0)))
        return outputs.movedim(0, 1), last_state

    return _rnn_scan


@register_patch("dynamo", "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu", reports=True)
def _patch_rwkv_attention_as_scan_op(original):
    """RWKV's attention without its CUDA kernel loops over the time steps in Python, as Mamba's scans do (see
    `_patch_selective_scan_as_scan_op`): `scan` carries its numerator, denominator and running maximum through the
    same steps for a symbolic length."""
    from torch._higher_order_ops.scan import scan

    def rwkv_linear_attention_cpu(time_decay, time_first, key, value, state=None, return_state=False):
        if not isinstance(key.shape[1], torch.SymInt):
            return original(time_decay, time_first, key, value, state=state, return_state=return_state)
        report_applied()
        keeps_state = return_state or state is not None
        if state is None:
            zeros = torch.zeros(key.shape[0], key.shape[2], dtype=torch.float32, device=key.device)
            state = [zeros, zeros.clone(), zeros - 1e38]
        decay = -torch.exp(time_decay)

        def step(carry, inputs):
            numerator_state, denominator_state, max_state = carry
            step_key, step_value = inputs
            step_key = step_key.float()
            max_for_output = torch.maximum(max_state, step_key + time_first)
            old, new = torch.exp(max_state - max_for_output), torch.exp(step_key + time_first - max_for_output)
            output = (old * numerator_state + new * step_value) / (old * denominator_state + new)
            max_for_state = torch.maximum(max_state + decay, step_key)
            old, new = torch.exp(max_state + decay - max_for_state), torch.exp(step_key - max_for_state)
            carry = [old * numerator_state + new * step_value, old * denominator_state + new, max_for_state]
            return carry, output.to(key.dtype)

        final, outputs = scan(step, [part.contiguous() for part in state], (key.movedim(1, 0), value.movedim(1, 0)))
        return outputs.movedim(0, 1), (final if keeps_state else None)

    return rwkv_linear_attention_cpu


@register_patch("dynamo", "transformers.models.xlstm.modeling_xlstm.xLSTMBackend.forward", reports=True)
def _patch_mlstm_inference_as_scan_op(original):
    """xLSTM's inference kernel runs whole chunks of 64 steps in its chunkwise form and the rest one step at a time
    in a Python loop; both fix a symbolic length. The recurrent step is the same recurrence the chunkwise form
    reformulates, so `scan` over that step covers every length (see `_patch_selective_scan_as_scan_op`). Training
    mode keeps its kernel."""
    from torch._higher_order_ops.scan import scan
    from transformers.models.xlstm.modeling_xlstm import mlstm_recurrent_step_native

    def forward(self, query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                return_last_states=None, mode=None):  # fmt: skip
        mode = mode or self.config.mode
        if "inference" not in mode or not isinstance(query.shape[2], torch.SymInt):
            return original(self, query, key, value, igate, fgate, c_initial, n_initial, m_initial,
                            return_last_states, mode)  # fmt: skip
        report_applied()
        state_dtype = getattr(torch, self.config.inference_state_dtype)
        batch, heads, _, key_size = query.shape
        if c_initial is None:
            c_initial = query.new_zeros(batch, heads, key_size, value.shape[-1], dtype=state_dtype)
            n_initial = query.new_zeros(batch, heads, key_size, dtype=state_dtype)
            m_initial = query.new_zeros(batch, heads, 1, dtype=state_dtype)

        def step(carry, inputs):
            step_query, step_key, step_value, step_igate, step_fgate = inputs
            output, carry = mlstm_recurrent_step_native(
                step_query, step_key, step_value, step_igate[:, :, None], step_fgate[:, :, None], *carry,
                eps=self.config.eps, dtype_state=state_dtype)  # fmt: skip
            return list(carry), output

        # time first; copies, as a scan's inputs must not alias one another
        steps = [tensor.movedim(2, 0).contiguous() for tensor in (query, key, value, igate, fgate)]
        initial = [state.to(state_dtype, copy=True) for state in (c_initial, n_initial, m_initial)]
        last, outputs = scan(step, initial, steps)
        return outputs.movedim(0, 2), tuple(last)

    return forward


@register_patch("dynamo", "torch.nn.LSTM.forward", reports=True)
def _patch_lstm_as_scan_op(original):
    """`nn.LSTM` traces as one `aten.lstm` op whose shape rule fixes the sequence length (Parakeet's and Nemotron's
    transducer decoders). For a symbolic length each layer and direction is a `scan` over the time
    steps (see `_patch_selective_scan_as_scan_op`), with the input projection of every step done at once: the same
    gates, cell and hidden states. Packed sequences, projections and training-time dropout keep the op."""
    from torch._higher_order_ops.scan import scan

    def forward(self, input, hx=None):
        time_axis = 1 if self.batch_first else 0
        plain = isinstance(input, torch.Tensor) and input.dim() == 3 and not self.proj_size
        plain = plain and not (self.training and self.dropout)
        if not plain or not isinstance(input.shape[time_axis], torch.SymInt):
            return original(self, input, hx)
        report_applied()
        steps = input.transpose(0, 1) if self.batch_first else input  # (time, batch, features)
        directions = 2 if self.bidirectional else 1
        if hx is None:
            zeros = steps.new_zeros(self.num_layers * directions, steps.shape[1], self.hidden_size)
            hx = (zeros, zeros)
        last_hidden, last_cell = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                weight_hh = getattr(self, f"weight_hh{suffix}")
                bias_hh = getattr(self, f"bias_hh{suffix}") if self.bias else None
                bias_ih = getattr(self, f"bias_ih{suffix}") if self.bias else None
                ordered = steps.flip(0) if direction else steps
                projected = torch.nn.functional.linear(ordered, getattr(self, f"weight_ih{suffix}"), bias_ih)

                def step(carry, gates_in, weight_hh=weight_hh, bias_hh=bias_hh):
                    hidden, cell = carry
                    gates = gates_in + torch.nn.functional.linear(hidden, weight_hh, bias_hh)
                    in_gate, forget_gate, candidate, out_gate = gates.chunk(4, dim=-1)
                    cell = torch.sigmoid(forget_gate) * cell + torch.sigmoid(in_gate) * torch.tanh(candidate)
                    hidden = torch.sigmoid(out_gate) * torch.tanh(cell)
                    return [hidden, cell], hidden.clone()  # the carry and the output must not alias

                index = layer * directions + direction
                # copies: the initial states may be one tensor (zeros, or a cache's), and a scan's inputs must not
                # alias one another when ONNX and ExecuTorch decompose it
                initial = [hx[0][index].clone(), hx[1][index].clone()]
                (hidden, cell), output = scan(step, initial, projected)
                outputs.append(output.flip(0) if direction else output)
                last_hidden.append(hidden)
                last_cell.append(cell)
            steps = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
        output = steps.transpose(0, 1) if self.batch_first else steps
        return output, (torch.stack(last_hidden), torch.stack(last_cell))

    return forward


@register_patch("dynamo", "transformers.models.funnel.modeling_funnel._relative_shift_gather")
def _patch_funnel_relative_shift_indexed(_original):
    """Funnel shifts its relative-position scores by reshaping the score matrix to another width and back, which
    with a symbolic length asks the trace to prove divisibilities it cannot, so the program keeps only lengths like
    the traced one. Each output element is one element of the flattened scores at an index that arithmetic gives:
    the same scores, read with one gather."""

    def _relative_shift_gather(positional_attn, context_len, shift):
        batch_size, n_head, seq_len, max_rel_len = positional_attn.shape
        rows = torch.arange(seq_len, device=positional_attn.device)[:, None]
        columns = torch.arange(context_len, device=positional_attn.device)[None, :]
        # where the reshape-drop-reshape lands element (row, column) in the flattened (seq_len, max_rel_len) scores
        index = shift * seq_len + rows * (max_rel_len - shift) + columns
        return positional_attn.reshape(batch_size, n_head, seq_len * max_rel_len)[:, :, index]

    return _relative_shift_gather


# Gated delta rule layers (Qwen3-Next family, OLMo Hybrid) solve each chunk's unit lower-triangular system with
# `solve_triangular`, which no ONNX or ExecuTorch op implements, and under export build its inverse row by row instead:
# 63 slice-and-scatter steps for a chunk of 64, hundreds of nodes per layer whose symbolic sizes make ExecuTorch's
# re-traces the slowest part of the sweep (its timeouts). Their module asks `is_torchdynamo_exporting` only there.
_DELTA_RULE_MODULES = ("olmo_hybrid", "qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen4_exp")


@register_patch("dynamo", *(f"transformers.models.{name}.modeling_{name}.is_torchdynamo_exporting"
                            for name in _DELTA_RULE_MODULES))  # fmt: skip
def _patch_delta_rule_solves_as_eager(_original):
    """The trace takes eager's branch, the triangular solve, which `_patch_unit_triangular_solve_as_products`
    expresses in matrix products."""
    return lambda: False


@register_patch("dynamo", "torch.linalg.solve_triangular", reports=True)
def _patch_unit_triangular_solve_as_products(original):
    """For a unit lower-triangular ``A = I - N`` (``N`` strictly lower, so ``N**n = 0``), ``A⁻¹ = I + N + N² + …``,
    which is ``(I + N)(I + N²)(I + N⁴)…``: about 2·log2(n) matrix products, exact up to rounding."""

    def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
        size = A.shape[-1]
        if isinstance(size, torch.SymInt):  # a width reshaped out of a symbolic length may still be proven constant
            from torch.fx.experimental.symbolic_shapes import statically_known_true

            hint = size.node.hint
            size = hint if hint is not None and statically_known_true(size == hint) else None
        if upper or not left or not unitriangular or out is not None or size is None:
            return original(A, B, upper=upper, left=left, unitriangular=unitriangular, out=out)
        report_applied()
        power = -A.tril(-1)
        inverse = torch.eye(size, dtype=A.dtype, device=A.device) + power
        for _ in range(max(size - 1, 1).bit_length() - 1):  # the powers up to N**(n-1)
            power = power @ power
            inverse = inverse + inverse @ power
        return inverse @ B

    return solve_triangular


@register_patch("dynamo", *(f"transformers.models.{name}.modeling_{name}.chunk_kimi_delta_attention"
                            for name in ("bailing_hybrid", "glm5_next", "kimi_linear")), reports=True)  # fmt: skip
def _patch_kimi_delta_chunks_fit_a_static_text(original):
    """Kimi delta attention (GLM-5 Next, Bailing Hybrid) inverts each chunk's triangular system row by row, always,
    one traced step per row of a 64-token chunk, whatever the text's length. The chunk is the algorithm's unit of
    work, not of its arithmetic: a static text shorter than a chunk is one chunk of its own length, the same outputs
    to rounding in as many steps as it has tokens. A symbolic length keeps the model's chunks (the program serves
    lengths up to one of them)."""

    def chunk_kimi_delta_attention(query, key, value, g, beta, chunk_size=64, **kwargs):
        length = query.shape[1]
        if isinstance(length, int) and length < chunk_size:
            report_applied()
            chunk_size = max(length, 1)
        return original(query, key, value, g, beta, chunk_size, **kwargs)

    return chunk_kimi_delta_attention


# Vision towers that pack several images into one sequence (Qwen-VL style, `cu_seqlens` marks where each image
# starts) attend image by image: `torch.split(q, lengths.tolist())`, sizes read from tensor values, which torch.export
# cannot trace. Their flash-attention branch hands `cu_seqlens` to the attention function instead, so for the trace
# those configs name a registered "flash" function that builds the block-diagonal mask and runs one SDPA.

SEGMENTED_ATTENTION = "flash_segments_as_mask"


def _segmented_sdpa(module, query, key, value, attention_mask=None, cu_seq_lens_q=None, **kwargs):
    """SDPA restricted to the segments of ``cu_seq_lens_q``: the same numbers as one SDPA per segment."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    if cu_seq_lens_q is None:  # called without boundaries (ColQwen2's text layers): one segment per sample
        return sdpa_attention_forward(module, query, key, value, attention_mask=attention_mask, **kwargs)
    positions = torch.arange(query.shape[-2], device=query.device)
    # boundaries passed, counted against all of them: slicing off the first and last would slice a length the
    # trace does not know, which ExecuTorch's slice decomposition guards on
    segment = (positions[:, None] >= cu_seq_lens_q[None, :]).sum(-1)
    mask = (segment[:, None] == segment[None, :])[None, None]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = mask & attention_mask
        else:
            mask = torch.where(mask, attention_mask, torch.finfo(query.dtype).min)
    # torch's SDPA itself: transformers' wrapper decides causality on `query length > 1` first, a guard on the
    # packed length, which is data-dependent (MiniCPM-V's merger); with a mask there is nothing to decide
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=kwargs.get("dropout", 0.0), scale=kwargs.get("scaling")
    )
    return output.transpose(1, 2).contiguous(), None


@contextmanager
def segmented_attention(model: torch.nn.Module, fired: set[str]):
    """Point the config of every attention module that takes ``cu_seqlens`` at `_segmented_sdpa` for the trace."""
    from transformers import AttentionInterface, PreTrainedConfig
    from transformers.utils.generic import is_flash_attention_requested

    configs = {
        id(module.config): module.config
        for module in model.modules()
        if isinstance(getattr(module, "config", None), PreTrainedConfig)
        and "cu_seqlens" in inspect.signature(module.forward).parameters
        and not is_flash_attention_requested(module.config)
    }
    saved = {key: config._attn_implementation for key, config in configs.items()}
    if configs:
        AttentionInterface.register(SEGMENTED_ATTENTION, _segmented_sdpa)
        fired.add("segmented_attention")
    try:
        for config in configs.values():
            config._attn_implementation = SEGMENTED_ATTENTION
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = saved[key]


# ── Stage 3: Pytree registration ─────────────────────────────────────────────
# A cache flattens to its tensors (the leaves, keyed by attribute path like `layers.0.keys`) and a JSON skeleton
# of everything else (the context), from which `_unflatten_from_context` rebuilds an equal object. The skeleton is
# a string, so it is hashable, comparable and saved as is with a `.pt2`. A type the attribute walk cannot handle
# gets a branch in both functions.

_TAG = "§"  # marks a skeleton node that is not plain JSON


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import_qualified(name: str) -> Any:
    module_name, _, qualname = name.partition(":")
    value = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _concrete(symbolic):
    """The value of a symbolic scalar that the trace has already fixed, else None."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    if free_symbols(symbolic):
        return None
    return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(symbolic)](symbolic)


def _flatten_to_context(value: Any, path: str, leaves: list) -> Any:
    """The JSON skeleton of ``value``; its tensors (and free symbolic scalars) are appended to ``leaves``."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        fixed = _concrete(value)
        if fixed is not None:
            return fixed
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        leaves.append((path, value))
        return {_TAG: "leaf", "index": len(leaves) - 1}
    if isinstance(value, torch.dtype):
        return {_TAG: "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {_TAG: "device", "name": str(value)}
    if isinstance(value, type):
        return {_TAG: "type", "name": _qualified_name(value)}
    if isinstance(value, torch.nn.Module):
        raise TypeError(f"{path or 'value'}: a {type(value).__name__} module inside a cache cannot be flattened")
    join = f"{path}." if path else ""
    if type(value) in (list, tuple):
        items = [_flatten_to_context(item, f"{join}{i}", leaves) for i, item in enumerate(value)]
        return items if type(value) is list else {_TAG: "tuple", "items": items}
    if isinstance(value, dict):
        pairs = [  # keys as skeletons too: JSON would turn a tuple key into an unhashable list
            [_flatten_to_context(key, path, leaves), _flatten_to_context(item, f"{join}{key}", leaves)]
            for key, item in value.items()
        ]
        return {_TAG: "dict", "class": _qualified_name(type(value)), "pairs": pairs}
    if hasattr(value, "__dict__") and not callable(value):
        state = {key: _flatten_to_context(item, f"{join}{key}", leaves) for key, item in vars(value).items()}
        return {_TAG: "object", "class": _qualified_name(type(value)), "state": state}
    raise TypeError(f"{path or 'value'}: cannot flatten a {type(value).__name__} for torch.export")


def _unflatten_from_context(skeleton: Any, leaves: list) -> Any:
    if isinstance(skeleton, list):
        return [_unflatten_from_context(item, leaves) for item in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    kind = skeleton[_TAG]
    if kind == "leaf":
        return leaves[skeleton["index"]]
    if kind == "dtype":
        return getattr(torch, skeleton["name"])
    if kind == "device":
        return torch.device(skeleton["name"])
    if kind == "type":
        return _import_qualified(skeleton["name"])
    if kind == "tuple":
        return tuple(_unflatten_from_context(item, leaves) for item in skeleton["items"])
    if kind == "dict":
        cls = _import_qualified(skeleton["class"])
        pairs = skeleton["pairs"]
        return cls((_unflatten_from_context(key, leaves), _unflatten_from_context(item, leaves)) for key, item in pairs)
    if kind == "object":
        cls = _import_qualified(skeleton["class"])
        value = cls.__new__(cls)
        value.__dict__.update({key: _unflatten_from_context(item, leaves) for key, item in skeleton["state"].items()})
        return value
    raise ValueError(f"unknown skeleton node {kind!r}")


def _flatten_with_keys(value):
    leaves: list = []
    skeleton = _flatten_to_context(value, "", leaves)
    return [(_pytree.MappingKey(path), leaf) for path, leaf in leaves], json.dumps(skeleton)


def _flatten(value):
    keyed, context = _flatten_with_keys(value)
    return [leaf for _key, leaf in keyed], context


def _unflatten(leaves, context: str):
    return _unflatten_from_context(json.loads(context), list(leaves))


def _register(cls: type) -> None:
    if cls in _pytree.SUPPORTED_NODES:
        return
    _pytree.register_pytree_node(
        cls,
        _flatten,
        _unflatten,
        serialized_type_name=_qualified_name(cls),
        flatten_with_keys_fn=_flatten_with_keys,
        to_dumpable_context=lambda context: context,
        from_dumpable_context=lambda context: context,
    )


def _subclasses(cls: type):
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def register_pytree_nodes(model: torch.nn.Module | None = None) -> None:
    """Register every transformers ``Cache`` type, and the ``*Cache`` classes of ``model``'s module."""
    from transformers.cache_utils import Cache

    for cls in [Cache, *_subclasses(Cache)]:
        _register(cls)
    if model is not None:
        module = inspect.getmodule(type(model))
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__ and value.__name__.endswith("Cache"):
                _register(value)


# ── Stage 4: Dynamic shapes ──────────────────────────────────────────────────


def auto_dynamic_shapes(value: Any) -> Any:
    """``Dim.AUTO`` on every axis of every tensor in ``value``, in the structure torch.export matches inputs by."""
    if isinstance(value, torch.Tensor):
        return {axis: torch.export.Dim.AUTO for axis in range(value.dim())}
    if type(value) in (list, tuple):
        return type(value)(auto_dynamic_shapes(item) for item in value)
    if type(value) is dict:
        return {key: auto_dynamic_shapes(item) for key, item in value.items()}
    node = _pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:  # a Cache or ModelOutput: one spec per child of its flatten
        children, _context = node.flatten_fn(value)
        return [auto_dynamic_shapes(child) for child in children]
    return None


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.DimConstraints.solve", reports=True)
def _patch_dim_constraints_unsolvable_left_as_guards(original):
    """After tracing, torch.export solves the guards on dynamic sizes with sympy to suggest fixes for constraint
    violations. Sympy cannot solve a divisibility through nested floors (Xcodec's audio length must be a multiple of
    its hop, 320: "cannot be solved using solve_univariate_inequality") and the whole export failed. With `Dim.AUTO`
    there is no violation to explain: the guard stays in the program as a run-time check."""

    def solve(self):
        try:
            return original(self)
        except NotImplementedError:
            report_applied()

    return solve


# ── Stage 5: State cleanup ───────────────────────────────────────────────────
# Attributes some modules fill in forward and read back on the next call (rotary tables cached by sequence length).
# Set during a trace they would hold fake tensors; left from an eager call they would be baked in as constants.

_STATEFUL_CACHE_ATTRS = (
    "cached_rotary_positional_embedding",  # Wav2Vec2-BERT, SeamlessM4T conformer rotary tables
    "cached_sequence_length",
)
# Buffers forward compares with numbers in Python `if`s: under export their values are unknown (`Eq(u0, 1)`), so for
# the trace they are the numbers they hold, as lists that index like the buffer.
_BUFFERS_READ_AS_NUMBERS = ("attn_mask_probs",)  # EoMT's mask annealing: which blocks mask attention, and how often


@contextmanager
def cleared_model_state(model: torch.nn.Module):
    saved = [
        (module, name, getattr(module, name))
        for module in model.modules()
        for name in _STATEFUL_CACHE_ATTRS
        if hasattr(module, name)
    ]
    buffers = {module: dict(module._buffers) for module in model.modules()
               if set(module._buffers) & set(_BUFFERS_READ_AS_NUMBERS)}
    for module, name, _value in saved:
        setattr(module, name, None)
    for module in buffers:
        for name in set(module._buffers) & set(_BUFFERS_READ_AS_NUMBERS):
            module.__dict__[name] = module._buffers.pop(name).tolist()  # found before `__getattr__` looks for buffers
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        for module, own in buffers.items():
            for name in _BUFFERS_READ_AS_NUMBERS:
                module.__dict__.pop(name, None)
            module._buffers.clear()
            module._buffers.update(own)  # in their order: the state dict's keys keep theirs
