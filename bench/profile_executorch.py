"""Where an ExecuTorch cell spends its time: a sampling profile (pyinstrument) of the ExecuTorch cells of a seeded
sample, each cell's time split by exporter stage and, inside a stage, by who does the work.

    .venv/bin/python bench/profile_executorch.py --sample 40 --seed 1 --out bench/profile_executorch.json
    # or in two processes, one per core, then summed:
    .venv/bin/python bench/profile_executorch.py --shard 1/2 --out a.json & ... --shard 2/2 --out b.json; wait
    .venv/bin/python bench/profile_executorch.py --combine a.json b.json --out bench/profile_executorch.json

Every sample is attributed three ways: to the exporter stage on its stack (torch-export, our FX fixes, to-edge,
to-executorch, load and run), to the outermost step of ExecuTorch's lowering under it (decompositions, edge passes,
partitioning, XNNPACK preprocessing, verifier, memory planning and emit, serialization), and to who does the work,
by its innermost frame (symbolic-shape reasoning, our workarounds, or the libraries). The cells run in this process,
one after the other (not under the sweep's workers), so the profile sees them whole; a cell is cut at --timeout.

With --compare, every cell runs twice, before and after the cost cuts (the decompositions that change nothing,
`exporters/executorch/decompositions.py`; graph code made only when used, in torch.export and the lowering,
`exporters/graph_code.py`; size expressions' facts computed once, `exporters/expression_facts.py`; XNNPACK's
partition merges tested from the pair's side, `partition_merging.py`, and the graph sorted in place after each
partition, `graph_sorting.py`, both in `exporters/executorch/`), in alternating
order, each profiled on its own: the two profiles, each cell's status and stage both ways, and the to-edge and
cell-time ratios, all from one run on one machine. Both variants start from the same warm-up (`warm_imports`,
which also freezes what it loaded out of the garbage collector's sight).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporters.dynamo.exporter as dynamo_exporter
import exporters.executorch.exporter as executorch_exporter
from bench.comparison import print_comparison
from exporters import expression_facts
from harness.cells import Cell, ClassContext, run_cell
from harness.models import select
from harness.workers import warm_imports

# the cost cuts --compare switches off for "before", by module and name
CUTS = {(module, name): getattr(module, name) for module, name in (
    (executorch_exporter, "redundant_decompositions_skipped"), (executorch_exporter, "graph_code_on_demand"),
    (dynamo_exporter, "graph_code_on_demand"), (expression_facts, "expression_facts_remembered"),
    (executorch_exporter, "partition_merging_over_the_pair"), (executorch_exporter, "graph_sorted_in_place"))}

# (stage, test on a frame) from the outside in: the first frame of a stack that matches names its stage
STAGES = [
    ("torch-export", lambda function, path: function == "trace_model" and "exporters/dynamo" in path),
    ("our FX fixes", lambda function, path: function in ("apply_fx_program_fixes", "apply_fx_node_fixes")),
    ("to-edge", lambda function, path: function == "to_edge_transform_and_lower"),
    ("to-executorch", lambda function, path: function == "to_executorch"),
    ("load and run", lambda function, path: "exporters/executorch/runtime.py" in path or function == "__call__"),
]

# (step, test) from the outside in, within a stage: which part of ExecuTorch's lowering runs
STEPS = [
    ("decompositions (run_decompositions)", lambda function, path: function == "run_decompositions"),
    ("edge passes (_generate_edge_program)", lambda function, path: function == "_generate_edge_program"),
    ("partitioning", lambda function, path: function in ("_create_partitions", "partition")),
    ("XNNPACK preprocessing", lambda function, path: function == "preprocess" and "xnnpack" in path),
    ("verifier", lambda function, path: "verifier" in path or "verification" in path),
    ("memory planning and emit", lambda function, path: "memory_planning" in path or "/emit/" in path),
    ("serialization", lambda function, path: "_serialize" in path),
    ("tracing (make_fx / export)", lambda function, path: "proxy_tensor" in path or "export/_trace.py" in path),
]

WORKAROUND_FILES = ("exporters/dynamo/patches/", "exporters/executorch/torch_patches", "lowering_patches", "node_fixes",
                    "program_fixes", "exporters/rewrites.py", "exporters/registration.py")
# (kind, test) from the inside out: the innermost frame that matches names who does the work. The interpreter that
# re-traces a program node by node lives in symbolic_shapes.py too (PropagateUnbackedSymInts.run_node): it is not
# reasoning, and counting it made every re-trace symbolic.
KINDS = [
    ("symbolic-shape reasoning", lambda function, path: "/sympy/" in path
     or ("symbolic_shapes" in path and function != "run_node") or "torch/utils/_sympy" in path
     or "value_ranges" in path),
    ("our workarounds", lambda function, path: any(part in path for part in WORKAROUND_FILES)),
]  # fmt: skip


def attribute(frame, stack, seconds_by, shape_mode):
    """Add each frame's own time to (shape mode, stage, step, kind) by its stack."""
    own = frame.time - sum(child.time for child in frame.children)
    stack = stack + [(frame.function or "", frame.file_path or "")]
    if own > 0:
        stage = next((name for name, test in STAGES for f, p in stack if test(f, p)), "other (eager inputs, parity)")
        step = next((name for f, p in stack for name, test in STEPS if test(f, p)), "other")
        kind = next((name for f, p in reversed(stack) for name, test in KINDS if test(f, p)), "the libraries")
        seconds_by[(shape_mode, stage, step, kind)] += own
    for child in frame.children:
        attribute(child, stack, seconds_by, shape_mode)


class CellTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CellTimeout()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shapes", default="static,dynamic")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--shard", default="1/1", help="i/n: every n-th class of the sample, from the i-th")
    parser.add_argument("--combine", type=Path, nargs="+", help="sum these outputs instead of profiling")
    parser.add_argument("--compare", action="store_true", help="each cell before and after the cost cuts")
    parser.add_argument("--out", type=Path, default=Path("bench/profile_executorch.json"))
    args = parser.parse_args()
    if args.combine:
        parts = [json.loads(path.read_text()) for path in args.combine]
        seconds_by = defaultdict(float)
        for part in parts:
            for row in part["profile"]:
                seconds_by[(row["shape_mode"], row["stage"], row["step"], row["kind"])] += row["seconds"]
        write(args, [cell for part in parts for cell in part["cells"]], seconds_by)
        return
    index, count = map(int, args.shard.split("/"))

    from pyinstrument import Profiler

    signal.signal(signal.SIGALRM, _alarm)
    warm_imports(["executorch"])  # as a sweep worker starts: imports and XNNPACK's first lowering are not a cell's
    seconds_by: dict[tuple[str, str, str, str], float] = defaultdict(float)
    cells = []
    variants = ["before", "after"] if args.compare else [None]
    for number, model_class in enumerate(select("all", sample=args.sample, seed=args.seed)[index - 1 :: count]):
        context = ClassContext(model_class).prepare()  # config, build, eager: shared by the class' cells, not profiled
        for shape_mode, variant in itertools.product(args.shapes.split(","), variants[:: 1 - 2 * (number % 2)]):
            for (module, name), cut in CUTS.items():  # before: each cut replaced by a context that does nothing
                setattr(module, name, (lambda *_: contextlib.nullcontext()) if variant == "before" else cut)
            label = f"{shape_mode}, {variant}" if variant else shape_mode
            profiler = Profiler(interval=0.01)
            start = time.perf_counter()
            signal.alarm(args.timeout)
            profiler.start()
            try:
                record = run_cell(Cell(model_class, "executorch", shape_mode), context)
                status, stage = record.status, record.stage
                stages = {s.name: s.seconds for s in record.stages}
            except CellTimeout:
                status, stage, stages = "timeout", None, {}
            finally:
                session = profiler.stop()
                signal.alarm(0)
            if session.root_frame() is not None:
                attribute(session.root_frame(), [], seconds_by, label)
            seconds = time.perf_counter() - start
            cells.append({"cell": f"{model_class.name}-executorch-{shape_mode}", "status": status, "stage": stage,
                          "seconds": round(seconds, 2), "stages": stages, "variant": variant})  # fmt: skip
            print(f"{cells[-1]['cell']} {variant or ''}: {status} {seconds:.1f} s", flush=True)
            write(args, cells, seconds_by, quiet=True)  # after each cell: a cut run keeps what it measured
    write(args, cells, seconds_by)


def write(args, cells, seconds_by, quiet=False):
    """The profile as JSON rows, each a share of its shape mode's total, and the largest printed."""
    totals = defaultdict(float)
    for (shape_mode, *_), seconds in seconds_by.items():
        totals[shape_mode] += seconds
    table = [{"shape_mode": shape_mode, "stage": stage, "step": step, "kind": kind, "seconds": round(seconds, 2),
              "share": round(seconds / totals[shape_mode], 4)}
             for (shape_mode, stage, step, kind), seconds in sorted(seconds_by.items(), key=lambda item: -item[1])]  # fmt: skip
    args.out.write_text(json.dumps({"sample": args.sample, "seed": args.seed, "cells": cells, "profile": table}, indent=1))
    for shape_mode, total in ({} if quiet else totals).items():
        print(f"{shape_mode}: {total:.0f} s profiled")
        for row in [row for row in table if row["shape_mode"] == shape_mode][:15]:
            print(f"  {row['share']:7.1%} {row['seconds']:9.1f} s  {row['stage']:<14} {row['step']:<38} {row['kind']}")
    if not quiet and any(cell.get("variant") for cell in cells):
        print_comparison(cells)


if __name__ == "__main__":
    main()
