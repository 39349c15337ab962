"""What one workaround costs or saves: each class exported with it and without it, alternating in one process.

A first export warms the imports up and is not counted. Prints each class' median seconds both ways and their ratio
(with / without), then the median ratio over the classes.

    .venv/bin/python bench/workaround_bench.py _patch_node_history_shared --classes BertModel,T5Model --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporters  # noqa: E402
from exporters.workarounds import disabled_workarounds  # noqa: E402
from harness.cells import ClassContext, export_options  # noqa: E402
from harness.models import select  # noqa: E402


def export_seconds(context: ClassContext, backend: str, shape: str, without: str | None) -> float:
    exporter, config = exporters.exporter_for(backend, **export_options(shape, context.inputs))
    start = time.perf_counter()
    with disabled_workarounds(without) if without else contextlib.nullcontext():
        exporter.export(context.model, context.inputs["A"], config)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workaround", help="the registered function's name, e.g. _patch_node_history_shared")
    parser.add_argument("--classes", required=True, help="comma-separated model classes")
    parser.add_argument("--backend", default="executorch")
    parser.add_argument("--shape", default="static", choices=("static", "dynamic"))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ratios = []
    for number, name in enumerate(args.classes.split(",")):
        context = ClassContext(select(name)[0]).prepare()
        if not context.ok:
            print(f"{name}: {context.stages[-1].name} failed, not measured")
            continue
        if number == 0:
            export_seconds(context, args.backend, args.shape, None)
        times = {"with": [], "without": []}
        for round_ in range(args.rounds):
            for mode in ("with", "without") if round_ % 2 else ("without", "with"):
                times[mode].append(
                    export_seconds(context, args.backend, args.shape, args.workaround if mode == "without" else None)
                )
        with_, without = statistics.median(times["with"]), statistics.median(times["without"])
        ratios.append(with_ / without)
        print(f"{name:40s} without {without:7.1f} s  with {with_:7.1f} s  ratio {with_ / without:.2f}", flush=True)
    if ratios:
        print(f"median ratio over {len(ratios)} classes: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
