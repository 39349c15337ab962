"""ExecuTorch to-edge (after the five workaround stages): ExecuTorch's decompositions, without the re-traces that
change nothing.

`to_edge_transform_and_lower` re-traces the whole program up to three times: ``run_decompositions({})`` to
functionalize it, then the decomposition table without the ops the partitioner keeps, then the full table after the
kept ops were renamed. Each re-trace costs about a tenth of to-edge (docs/performance.md), and two of them are
often no-ops: any table pass functionalizes, so the empty one is redundant when a table pass follows; and the last
pass has nothing to do when no node of the (already functional) program calls an op of its table but the size
queries of a dynamic program, which a re-trace makes again as they were. ExecuTorch skips the second case, size
queries excepted, on one of its two paths; this skips both on every path, for the duration of to-edge.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

# in the table, but a re-trace makes the same node again: a dynamic program always has them
SIZE_QUERIES = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                          torch.ops.aten.sym_storage_offset.default})  # fmt: skip


@contextlib.contextmanager
def redundant_decompositions_skipped(program, partitioners):
    """While active, ``ExportedProgram.run_decompositions`` returns its program unchanged when the call would not
    change it: the first, empty-table call when every partitioner's path runs a table pass after it (partitioners
    that check ops, or none at all), and a table call on a program a decomposition made when no node uses the table
    but for size queries.
    """
    from executorch.exir.graph_module import contains_any_call_fn_target_op
    from torch.export import ExportedProgram

    original = ExportedProgram.run_decompositions
    # a partitioner without an op check may skip its table pass, leaving the empty-table pass the only one
    table_pass_follows = all(partitioner.ops_to_not_decompose(program)[1] is not None for partitioner in partitioners)
    calls = 0
    decomposed: weakref.WeakSet = weakref.WeakSet()

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        nonlocal calls
        calls += 1
        if not args and not kwargs and decomp_table is not None:
            if calls == 1 and not decomp_table and table_pass_follows:
                return self
            if self in decomposed and decomp_table and not contains_any_call_fn_target_op(
                self.graph_module, decomp_table.keys() - SIZE_QUERIES
            ):
                return self
        result = original(self, decomp_table, *args, **kwargs)
        decomposed.add(result)
        return result

    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = original
