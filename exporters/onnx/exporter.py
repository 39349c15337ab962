"""OnnxExporter: a transformers model to an ONNX graph run by ONNX Runtime.

Built on ``torch.onnx.export(..., dynamo=True)`` of the Dynamo trace (see ``exporters/dynamo/``), in five stages,
whose workarounds are in ``workarounds.py``, in this order:

1. torch patches: ``@register_patch("onnx", "torch....")``, active while the model is traced;
2. ONNX patches: ``@register_patch("onnx", "torch.onnx....")`` and other exporter internals, active during the
   conversion; one re-runs the FX node fixes after ``run_decompositions``, whose output has new nodes;
3. FX node fixes: ``@register_fx_node_fix("onnx")``, on the traced graph and again after decompositions;
4. ONNX translations: ``@register_onnx_translation(aten_op)`` (``ONNX_TRANSLATIONS``), for an aten op whose
   default lowering is missing or wrong;
5. ONNX IR fixes: ``@register_onnx_ir_fix`` (``ONNX_IR_FIXES``), on the finished graph, for ONNX Runtime bugs.

The translation reuses torch.onnx's registry of torchlib translations, built once per process
(``torchlib_registry.py``): a cost cut, not a workaround. ``OnnxConfig(optimize=False)`` skips the onnxscript
optimizer (run between 4 and 5). The artifact, ``OnnxExported``,
is in ``runtime.py``. List every workaround: ``grep -nE "^def (_patch_|_fix_|_aten_)" exporters/onnx/*.py``.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, replace

import torch

from ..dynamo.exporter import DynamoConfig, trace_model
from ..errors import OnnxExportError
from ..exported import build_metadata
from ..expression_facts import remembering_expression_facts
from ..registration import ONNX_IR_FIXES, ONNX_TRANSLATIONS, apply_fx_node_fixes, apply_patches, is_backend_internal
from ..stages import StageLog
from .runtime import OnnxExported
from .torchlib_registry import torchlib_registry_built_once
from .workarounds import CONVERSION_HOOK, conversion_log


@dataclass
class OnnxConfig(DynamoConfig):
    opset: int | None = None  # None: torch.onnx's default
    optimize: bool = True


class OnnxExporter:
    """``OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))`` -> a callable ``OnnxExported``."""

    @remembering_expression_facts
    def export(self, model: torch.nn.Module, inputs: dict, config: OnnxConfig | None = None) -> OnnxExported:
        config = config or OnnxConfig()
        log = StageLog(OnnxExportError)
        fired: set[str] = set()
        try:
            with ExitStack() as active:
                with log.stage("torch-patches"):
                    active.enter_context(apply_patches("onnx", fired, select=lambda path: not is_backend_internal(path)))
                traced = trace_model(model, inputs, config, log)
                traced = replace(traced, output_names=_computed_output_names(traced))
                active.close()  # torch patches serve the trace only
                with log.stage("fx-node-fixes"):
                    apply_fx_node_fixes("onnx", traced.program.graph_module, log.applied)
                with log.stage("onnx-patches"):
                    active.enter_context(apply_patches("onnx", fired, select=is_backend_internal))
                    active.enter_context(conversion_log(log))
                with log.stage("onnx-translation"), torchlib_registry_built_once():
                    onnx_program = torch.onnx.export(
                        traced.program,
                        (),
                        kwargs={name: value for name, value in inputs.items() if name not in traced.constants},
                        input_names=traced.input_names,
                        output_names=traced.output_names,
                        custom_translation_table=ONNX_TRANSLATIONS,
                        opset_version=config.opset,
                        optimize=False,
                        dynamo=True,
                        verbose=False,
                    )
                    _name_inputs_and_outputs(onnx_program.model.graph, traced.input_names, traced.output_names)
                if config.optimize:  # with the patches on the optimizer's internals
                    with log.stage("optimize"):
                        onnx_program.optimize()
            with log.stage("ir-fixes"):
                log.note(fix.__name__ for fix in ONNX_IR_FIXES if fix(onnx_program.model))
        finally:
            fired.discard(CONVERSION_HOOK)  # the stage 2 hook itself, not a workaround
            log.note(sorted(fired))
        metadata = build_metadata("onnx", model, traced, config, log)
        return OnnxExported(onnx_program.model, metadata)


def _computed_output_names(traced) -> list[str]:
    """The names of the outputs the program computes. Python numbers a forward returns beside its tensors (the
    step Qwen3-Omni's code predictor is at) stay constants of the program; an ONNX graph leaves them out."""
    from torch.export.graph_signature import ConstantArgument, OutputKind

    specs = [spec for spec in traced.program.graph_signature.output_specs if spec.kind == OutputKind.USER_OUTPUT]
    return [name for name, spec in zip(traced.output_names, specs, strict=True)
            if not isinstance(spec.arg, ConstantArgument)]


def _name_inputs_and_outputs(graph, input_names: list[str], output_names: list[str]) -> None:
    """Give the graph's inputs and outputs our names. An output that is an input passed through (a decode step's
    cross-attention cache) becomes an Identity of it: one value cannot carry both names, and the converter would
    otherwise rename the input."""
    import onnx_ir

    for index, value in enumerate(list(graph.outputs)):
        if value.is_graph_input():
            identity = onnx_ir.node("Identity", [value])
            copy = identity.outputs[0]
            copy.shape, copy.type = value.shape, value.type
            graph.append(identity)
            graph.outputs[index] = copy
    for value, name in zip(graph.inputs, input_names):
        value.name = name
    for value, name in zip(graph.outputs, output_names):
        value.name = name


class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def warm_up_onnx() -> None:
    """A one-op export: what every ONNX export builds first (torch.onnx's lazy imports, the torchlib registry) is
    built once, in a sweep's parent, for every child it forks."""
    OnnxExporter().export(_Double(), {"x": torch.ones(2)})
