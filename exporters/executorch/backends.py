"""ExecuTorch stage 1, backend preparation: ``prepare_for_<name>(model) -> partitioners`` puts the model on the
backend's device and dtype; ``warm_up_xnnpack`` builds XNNPACK's reference graphs once per process.
"""

from __future__ import annotations

import torch

from ..registration import register_executorch_backend


# ── Stage 1: Backend preparation ─────────────────────────────────────────────
# `@register_executorch_backend(name)` on `prepare_for_<name>(model) -> partitioners`.


@register_executorch_backend(
    "xnnpack",
    model_side="Not a workaround: it is backend setup (selects XnnpackPartitioner, puts the model on the CPU and"
               " casts floating tensors to float32, or keeps a half-precision model in its dtype), so no upstream or"
               " modeling change would remove it.",
)
def prepare_for_xnnpack(model):
    """XNNPACK: float32 (or the model's half dtype) on the CPU, delegated subgraphs where XNNPACK has kernels, the
    portable ops elsewhere."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    on_cpu_in_its_float_dtype(model)
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


@register_executorch_backend(
    "portable",
    model_side="Not a workaround: it is backend setup (portable kernels only, no partitioner; the model is put "
               "on the CPU and cast to float32 unless it is a half-precision model), so no upstream or modeling change "
               "would remove it.",
)
def prepare_for_portable(model):
    """Portable: ExecuTorch's reference kernels only, no delegate."""
    on_cpu_in_its_float_dtype(model)
    return []


def on_cpu_in_its_float_dtype(model) -> None:
    """The model on the CPU in float32, or in the half dtype all its floating parameters share (a half-precision
    export): a model built in float32 may still hold float64 or half tensors the kernels would not take mixed."""
    dtypes = {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()}
    half = dtypes.pop() if len(dtypes) == 1 and dtypes <= {torch.float16, torch.bfloat16} else None
    model.to(device="cpu")
    # floating tensors only: `.to(dtype)` drops complex buffers' imaginary part
    {torch.float16: model.half, torch.bfloat16: model.bfloat16}.get(half, model.float)()


@register_executorch_backend(
    "cuda",
    model_side="Not a workaround: it is backend setup (CudaPartitioner on a CUDA device, failing early when none"
               " exists), so no upstream or modeling change would remove it.",
)
def prepare_for_cuda(model):
    """CUDA: the ExecuTorch CUDA delegate, which needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("the ExecuTorch 'cuda' backend needs a CUDA device, and this machine has none")
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    model.to(device="cuda")
    return [CudaPartitioner([])]
