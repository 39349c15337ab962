"""Stage 2 model patches: torch and transformers code every model runs through: a module's cast to its own dtype,
torch's contiguity test, the experts interface, `len` of a tensor and `take_along_dim` on symbolic sizes, and
float16 overflow checks.
"""

from __future__ import annotations

import torch

from ...registration import register_patch, report_applied
from ...rewrites import contiguity_asked_without_guards


# ── Stage 2: Model patches ───────────────────────────────────────────────────


@register_patch(
    "dynamo", "torch.nn.Module.to", reports=True,
    upstream="https://github.com/pytorch/pytorch/pull/184976",
)
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


@register_patch(
    "dynamo", "torch._prims_common.is_contiguous", reports=True,
    upstream="https://github.com/pytorch/pytorch/pull/185084",
)
def _patch_contiguity_asked_without_guards(original):
    """Tracing records whether each result is contiguous, asking torch's "false when unsure" contiguity test. That
    test still guards on a symbolic size whose example is 0, 1 or 2 (too few elements to matter, a dimension of one
    to skip): DeepSeek V4 keeps the `length % 4` tokens past its last window, an example of one token when a prompt
    of 7 is traced, and the program then refused a prompt of 5; HunYuan-VL's `images - 1` fixed the image count at
    2 in ExecuTorch's re-trace (pytorch/pytorch#165032). Unsure stays false here without a guard: a size is skipped
    or counted small only when it is so for every size the program takes."""
    return contiguity_asked_without_guards(original)


@register_patch(
    "dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface", reports=True,
    model_side="transformers' ExpertsInterface (integrations/moe.py) dispatches to the exportable `batched_mm` "
               "experts implementation while exporting (torch.compiler.is_exporting()) instead of `grouped_mm` "
               "(the `transformers::grouped_mm_fallback` custom op fed by torch.histc) or the "
               "`nonzero()`-looping `eager` one, also for layers whose config names none.",
)
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
    upstream="https://github.com/pytorch/pytorch/pull/185804",
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


@register_patch(
    "dynamo", "torch.take_along_dim", "torch.Tensor.take_along_dim", reports=True,
    model_side="PPDocLayoutV2ForObjectDetection.forward reorders its queries with torch.gather(..., dim=1, "
               "index) instead of torch.take_along_dim (whose torch._refs decomposition broadcasts via "
               "infer_size_shapes and guards every symbolic axis).",
)
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


# what a float16 overflow check answers under export: "not all finite", "some infinite", so the clamp runs
_OVERFLOW_ANSWERS = {("isfinite", "all"): False, ("isinf", "any"): True}


@register_patch(
    "dynamo", "torch.isfinite", "torch.isinf", "torch.Tensor.all", "torch.Tensor.any", "torch.Tensor.__bool__",
    reports=True,
    model_side="transformers: the float16 encoder layers of BART and the models copied from it (PLBart, Marian, "
               "MVP, LED, BigBird-Pegasus, Blenderbot Small, NLLB-MoE, Informer, Time Series Transformer) and "
               "LongT5 / Pix2Struct clamp their hidden states unconditionally (as Whisper, mBART and Pegasus do) or "
               "with torch.where (as T5 does since huggingface/transformers#22097), not behind "
               "`not torch.isfinite(hidden_states).all()`, a branch on data.",
)
def _patch_half_overflow_check_answered(original):
    """BART's float16 encoder layers clamp their hidden states only when some value overflowed
    (`if ... and not torch.isfinite(hidden_states).all()`); LongT5's ask `torch.isinf(...).any()`. The branch reads
    data, which export cannot trace ("Could not guard on data-dependent expression Eq(u0, 1)"). Answered "it
    overflowed", the clamp runs always: it changes nothing finite below the clamp value (float16's largest less
    1,000), as the models that clamp unconditionally do. Only the truth value of such a check is answered; the
    tensors stay what they are."""
    name = original.__name__
    if name in ("isfinite", "isinf"):

        def check(input, *args, **kwargs):
            mask = original(input, *args, **kwargs)
            if isinstance(input, torch.Tensor) and input.dtype == torch.float16:
                mask._overflow_check = name
            return mask

        return check
    if name in ("all", "any"):

        def reduce(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            answer = _OVERFLOW_ANSWERS.get((getattr(self, "_overflow_check", None), name))
            if answer is not None and not args and not kwargs:
                result._overflow_answer = answer
            return result

        return reduce

    def truth(self):
        answer = getattr(self, "_overflow_answer", None)
        if answer is None:
            return original(self)
        report_applied()
        return answer

    return truth
