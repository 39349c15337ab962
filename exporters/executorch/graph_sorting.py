"""A lowered graph put back in topological order without copying it: a cost cut of to-edge, not a workaround.

After cutting each partition out of the graph, ExecuTorch (1.5.1, ``create_submodule_from_nodes``) sorts the whole
graph again with torch's ``legalize_graph``, which builds a new graph node by node in a breadth-first order. In a
graph cut into many partitions, those copies are a large share of to-edge (Funnel's dynamic cell: 443,507 node
copies, docs/performance.md). Here the same order is computed, and the graph's own nodes are moved into it; the
names, the name table, the node lookup table and the order of each node's users are those a new graph built in that
order would have, so the lowered program is the same, byte for byte.

The upstream change that would make this module unneeded: ExecuTorch's planned move of its partition fusing to
torch's ``fuse_by_partitions`` (its TODO T153794167 beside the call), which sorts once for all partitions.
"""

from __future__ import annotations

import collections
import contextlib
import operator
from collections.abc import Iterator

import torch

# what legalize_graph takes first once its inputs are ready (torch 2.13): size arithmetic, comparisons and
# assertions, so that a check comes before the data-dependent ops it guards; a test compares the two lists
_TAKEN_FIRST = (
    operator.add, operator.mul, operator.sub, operator.floordiv, operator.truediv, operator.mod, operator.le,
    operator.lt, operator.ge, operator.gt, operator.eq, operator.ne, torch.ops.aten.sym_constrain_range.default,
    torch.ops.aten.sym_constrain_range_for_size.default, torch.ops.aten._assert_async.msg,
    torch.ops.aten.scalar_tensor.default, torch.ops.aten._assert_scalar.default,
)  # fmt: skip


@contextlib.contextmanager
def graph_sorted_in_place() -> Iterator[None]:
    """While active, ExecuTorch's ``create_submodule_from_nodes`` sorts its graph module with ``sort_in_place``."""
    import executorch.exir.lowered_backend_module as lowered_backend_module

    original = lowered_backend_module.legalize_graph
    lowered_backend_module.legalize_graph = sort_in_place
    try:
        yield
    finally:
        lowered_backend_module.legalize_graph = original


def sort_in_place(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``legalize_graph(graph_module)``'s result, made by moving the graph's nodes instead of copying them."""
    from torch.fx.graph import _Namespace

    graph = graph_module.graph
    order = _breadth_first_order(graph)
    names = _Namespace()  # a new graph's, filled in the new order: later nodes are named as after legalize_graph
    lookup = type(graph._find_nodes_lookup_table)()
    for node in order:
        if names.create_name(node.name, None) != node.name:
            # a name torch.export gave an input that a new graph refuses (`input`, `type`): torch's copy renames it,
            # and the graph is not touched yet
            from torch.fx.passes.tools_common import legalize_graph

            return legalize_graph(graph_module)
        names.associate_name_with_obj(node.name, node)
    users: dict[torch.fx.Node, dict] = {node: {} for node in order}
    for node in order:
        graph._root.prepend(node)  # to the end, in turn
        lookup.insert(node)
        for source in node._input_nodes:  # a copy is a user of its inputs in the order the copies are made
            users[source][node] = None
    for node in order:  # the next sort walks users in that order
        node.users.clear()
        node.users.update(users[node])
    graph._graph_namespace = names
    graph._find_nodes_lookup_table = lookup
    graph_module.recompile()
    return graph_module


def _breadth_first_order(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """``legalize_graph``'s order: breadth first from the nodes that depend on nothing, the size checks and
    assertions torch lists there taken first."""
    pending = dict.fromkeys(graph.nodes, 0)
    for node in graph.nodes:
        for user in node.users:
            pending[user] += 1
    queue = collections.deque(node for node, count in pending.items() if count == 0)
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for user in node.users:
            pending[user] -= 1
            if pending[user] == 0:
                if user.op == "call_function" and user.target in _TAKEN_FIRST:
                    queue.appendleft(user)
                else:
                    queue.append(user)
    if len(order) < len(pending):
        raise RuntimeError(f"Input graph has cycles, unable to add {[node for node, count in pending.items() if count]}")
    return order
