"""XNNPACK's partition merging without reading every node downstream of a partition: a cost cut of to-edge, not a
workaround.

ExecuTorch's ``GroupBasedPartitioner`` (1.5.1) tries to merge every pair of partitions. For each node just outside a
pair, it reads the whole set of nodes downstream of that node, looking for one inside the pair: a merge would make a
cycle. In a large graph cut into many partitions, that scan dominates to-edge (Nemotron 3.5 Transcribe's dynamic
lowering: over a quarter of it, docs/performance.md). Whether two sets meet is answered by walking the smaller one,
here the pair; the answer, and then the same graph check ExecuTorch makes last, are unchanged. Upstream cut the
same merge loop once (pytorch/executorch#12798: pairs with a partition already merged are not tried); the scan of
each downstream set stayed.

The upstream change that would make this module unneeded: ``_can_merge_partitions`` testing
``combined_nodes.isdisjoint(downstream_nodes)`` instead of scanning ``downstream_nodes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def partition_merging_over_the_pair() -> Iterator[None]:
    """While active, ``GroupBasedPartitioner._can_merge_partitions`` tests set overlap from the pair's side."""
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import validate_partition

    original = GroupBasedPartitioner.__dict__["_can_merge_partitions"]

    def can_merge(self, first, second, partitions_by_id):
        pair = set(partitions_by_id[first].nodes) | set(partitions_by_id[second].nodes)
        outside_users = {user for node in pair for user in node.users if user not in pair}
        if any(not pair.isdisjoint(self.dependency_viewer.downstreams_of(user)) for user in outside_users):
            return False  # a path leaves the pair and comes back: merged, it would be a cycle
        return validate_partition(list(pair))

    GroupBasedPartitioner._can_merge_partitions = can_merge
    try:
        yield
    finally:
        GroupBasedPartitioner._can_merge_partitions = original
