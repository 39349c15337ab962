"""DynamoExporter: a transformers model to a ``torch.export`` ``ExportedProgram``.

``trace_model`` is the part the ONNX and ExecuTorch exporters share; it runs these stages in order:

1. forward signature: ``model.forward`` takes exactly the traced inputs, by name; the rest are baked in as
   constants, and so are inputs whose values the model reads as sizes (``SIZE_INPUTS``) in a static export;
2. model patches: ``@register_patch("dynamo", ...)`` in ``exporters/dynamo/patches/``, one file per family, and
   packed-sequence attention as one masked SDPA (``patches/attention.py``);
3. pytree registration: every ``Cache`` (and model-local ``*Cache``) type flattens to its tensors and rebuilds
   (``exporters/pytree.py``);
4. dynamic shapes: ``Dim.AUTO`` on every axis of every input tensor and cache leaf, or ``config.dynamic_shapes``;
5. state cleanup: tensor attributes a model caches in ``forward`` (``_STATEFUL_CACHE_ATTRS``) are emptied for the
   trace and restored after it, so neither stale eager state nor fake tensors cross the trace; buffers read as
   Python numbers (``_BUFFERS_READ_AS_NUMBERS``) are those numbers for the trace.

Then ``torch.export.export`` traces the model, generating the Python code of its intermediate graphs only if used
(``exporters/graph_code.py``); a size expression's facts are computed once per export
(``exporters/expression_facts.py``). Both are cost cuts, not workarounds. The artifact, ``DynamoExported``, is in ``runtime.py``.
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree

from ..errors import DynamoExportError
from ..exported import build_metadata
from ..expression_facts import remembering_expression_facts
from ..graph_code import graph_code_on_demand
from ..leaves import spec_leaf_names, split_inputs
from ..pytree import is_flattened_here, register_pytree_nodes
from ..registration import apply_patches, register_switch
from ..stages import StageLog
from .patches.attention import segmented_attention  # imports every family of patches, in registration order
from .runtime import DynamoExported


@dataclass
class DynamoConfig:
    dynamic: bool = False
    # Overrides the automatic Dim.AUTO shapes: {input name: spec}, as torch.export takes it.
    dynamic_shapes: Any = None
    strict: bool = False


class DynamoExporter:
    """``DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))`` -> a callable ``DynamoExported``."""

    @remembering_expression_facts
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
                if isinstance(spec.context, str) and is_flattened_here(spec.type)}


def _size_or_symbol(size) -> int | str:
    # a symbol a later guard pinned to one value prints as that value
    text = str(size)
    return int(text) if text.isdigit() else text


SIZE_INPUTS_AS_CONSTANTS = register_switch(
    "dynamo", "size_inputs_as_constants",
    "A static export bakes the inputs a model reads as sizes (image sizes, grids) into the program",
    "signature",
    model_side="Models read image and audio geometry (`image_sizes`, `image_grid_thw`, `spatial_shapes`, ...) "
               "with tensor ops rather than as Python numbers, so a static export need not bake it in.",
)


def trace_model(model: torch.nn.Module, inputs: dict[str, Any], config: DynamoConfig, log: StageLog) -> Traced:
    """Run stages 1 to 5 around ``torch.export.export``; every failure names its stage."""
    traced_inputs, constants = split_inputs(inputs, sizes_as_constants=not config.dynamic)
    # an input that is a view would have its base traced and guarded too, a tensor no caller of the program passes
    traced_inputs = {name: value.clone() if isinstance(value, torch.Tensor) and value._base is not None else value
                     for name, value in traced_inputs.items()}
    size_dtypes = {name: inputs[name].dtype for name in constants if isinstance(inputs[name], torch.Tensor)}
    fired: set[str] = {SIZE_INPUTS_AS_CONSTANTS} if size_dtypes else set()
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
            # Dynamo compiles a `scan`'s body, and its code cache outlives the export: reused by a later export, the
            # body compiled for an earlier trace fixed axes this one leaves dynamic (RecurrentGemma's batch)
            torch._dynamo.reset()
        try:
            with log.stage("torch-export"), graph_code_on_demand():
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
# `@register_patch("dynamo", path)` factories in `patches/`, one file per family, installed for the trace by
# `apply_patches("dynamo")`; `segmented_attention` (`patches/attention.py`) switches packed-sequence attention to one
# masked SDPA. The ONNX and ExecuTorch exporters trace through this stage too, so a fix there serves all three.


# ── Stage 3: Pytree registration ─────────────────────────────────────────────
# `register_pytree_nodes` (`exporters/pytree.py`): caches flatten to their tensors and a JSON skeleton of the rest.


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
