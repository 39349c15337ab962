"""ExecutorchExporter: a transformers model to an ExecuTorch ``.pte`` program run by the ExecuTorch runtime.

Around ``to_edge_transform_and_lower`` and ``to_executorch``, in five stages, one file of workarounds each:

1. backend preparation (``backends.py``): ``prepare_for_<name>`` (``EXECUTORCH_BACKENDS``) puts the model on the
   backend's device and dtype and returns its partitioners;
2. torch patches (``torch_patches.py``): ``@register_patch("executorch", "torch....")``, active while the model is
   traced;
3. ExecuTorch patches (``lowering_patches.py``): ``@register_patch("executorch", "executorch....")``, active while
   it is lowered;
4. FX program fixes (``program_fixes.py``): ``@register_fx_program_fix("executorch")``, when the fix needs the whole
   program;
5. FX node fixes (``node_fixes.py``): ``@register_fx_node_fix("executorch")``, one node at a time.

To-edge then runs without the decompositions that would change nothing (``decompositions.py``), to-edge and
to-executorch generate the Python code of a graph only when it is used (``exporters/graph_code.py``), XNNPACK's
partitioner tests a merge from the pair's side (``partition_merging.py``), the graph is sorted again in place after
each partition is cut out (``graph_sorting.py``), and the whole export computes a size expression's facts once
(``exporters/expression_facts.py``): cost cuts, not workarounds; the programs are the same.

ExecuTorch is imported on first use: it costs seconds, and the other backends do not need it. The artifact,
``ExecutorchExported``, is in ``runtime.py``.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch

from ..dynamo.exporter import DynamoConfig, trace_model
from ..errors import ExecutorchExportError
from ..exported import build_metadata
from ..expression_facts import remembering_expression_facts
from ..graph_code import graph_code_on_demand
from ..registration import (
    EXECUTORCH_BACKENDS,
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    is_backend_internal,
)
from ..rewrites import without_autograd_for_scans
from ..stages import StageLog
from .decompositions import redundant_decompositions_skipped
from .graph_sorting import graph_sorted_in_place
from .partition_merging import partition_merging_over_the_pair
from .runtime import ExecutorchExported


@dataclass
class ExecutorchConfig(DynamoConfig):
    backend: str = "xnnpack"


class ExecutorchExporter:
    """``ExecutorchExporter().export(model, inputs, ExecutorchConfig())`` -> a callable ``ExecutorchExported``."""

    @remembering_expression_facts
    def export(self, model: torch.nn.Module, inputs: dict, config: ExecutorchConfig | None = None) -> ExecutorchExported:
        config = config or ExecutorchConfig()
        log = StageLog(ExecutorchExportError)
        fired: set[str] = set()
        try:
            with log.stage("backend-preparation"):
                if config.backend not in EXECUTORCH_BACKENDS:
                    raise ValueError(
                        f"unknown ExecuTorch backend {config.backend!r}: expected one of {', '.join(EXECUTORCH_BACKENDS)}"
                    )
                partitioners = EXECUTORCH_BACKENDS[config.backend](model)
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

                active.enter_context(graph_code_on_demand())
                active.enter_context(partition_merging_over_the_pair())
                active.enter_context(graph_sorted_in_place())
                with log.stage("to-edge"), redundant_decompositions_skipped(traced.program, partitioners):
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
