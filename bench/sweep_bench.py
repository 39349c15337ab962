"""How much the sweep harness costs on top of the export work it runs, and how fast a fully cached re-run is.

For a fixed set of classes: (a) the sum of pure stage times, (b) the sweep's wall time x workers, their ratio (the
harness overhead) and the overhead per cell in milliseconds, (c) the wall time of a second run that reuses every
cell, as a share of the cold run, (d) the peak resident memory of a worker, (e) the CPU time the parent process
itself spent during the cold run (polling its workers), as a share of the workers' time. Each figure is the median
over --repeats runs measured in this one process, one after the other. With --private-memory-every A,B the rounds
alternate between the two intervals of reading a worker's private memory (``PRIVATE_MEMORY_EVERY``).

    .venv/bin/python bench/sweep_bench.py --repeats 3 --jobs 2 --backends dynamo,onnx
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.cache import ResultCache  # noqa: E402
from harness.models import select  # noqa: E402
from harness.records import SHARED_STAGES  # noqa: E402
from harness.store import RunStore  # noqa: E402
from harness.sweep import Plan, Progress, run_sweep  # noqa: E402
from harness import workers  # noqa: E402
from harness.workers import WorkerOptions, warm_imports  # noqa: E402

CLASSES = (
    "BertModel,DistilBertForSequenceClassification,RobertaForMaskedLM,GPT2LMHeadModel,LlamaForCausalLM,"
    "Qwen2ForCausalLM,GemmaForCausalLM,MistralForCausalLM,Phi3ForCausalLM,T5ForConditionalGeneration,"
    "BartForConditionalGeneration,ViTForImageClassification,ResNetForImageClassification,ConvNextModel,"
    "Dinov2Model,WhisperForConditionalGeneration,Wav2Vec2ForCTC,CLIPModel,MixtralForCausalLM,MambaForCausalLM"
)


def pure_stage_seconds(records) -> float:
    """Stage time without double counting: a class' shared stages once, each cell's own stages."""
    total, seen = 0.0, set()
    for record in records:
        for stage in record.stages:
            if stage.name in SHARED_STAGES:
                if record.model_class not in seen:
                    total += stage.seconds
            else:
                total += stage.seconds
        seen.add(record.model_class)
    return total


def one_round(plan_args, jobs: int, workspace: Path) -> dict:
    classes, backends, shapes = plan_args
    options = WorkerOptions(timeout=600, threads=1, log_dir=workspace / "logs")
    cache = ResultCache(workspace / "cache")
    cold = RunStore(workspace / "cold")
    cold.create({"purpose": "benchmark"})
    plan = Plan(classes, backends, shapes)
    start, parent_cpu = time.perf_counter(), time.process_time()
    run_sweep(plan, cold, options, jobs, progress=Progress(plan.total, stream=open("/dev/null", "w")))
    cold_wall, parent_cpu = time.perf_counter() - start, time.process_time() - parent_cpu
    records = cold.records()
    cache.save_from(cold, since="")  # a fresh run folder: every record is this run's
    warm = RunStore(workspace / "warm")
    warm.create({"purpose": "benchmark"})
    start = time.perf_counter()
    run_sweep(Plan(classes, backends, shapes), warm, options, jobs, reuse=ResultCache(workspace / "cache").lookup,
              progress=Progress(plan.total, stream=open("/dev/null", "w")))  # fmt: skip
    warm_wall = time.perf_counter() - start
    reused = sum(record.reused for record in warm.records())
    pure = pure_stage_seconds(records)
    return {
        "cells": len(records),
        "pure_stage_seconds": pure,
        "wall_seconds": cold_wall,
        "wall_x_workers": cold_wall * jobs,
        "overhead_ratio": cold_wall * jobs / pure,
        "overhead_ms_per_cell": 1000 * (cold_wall * jobs - pure) / len(records),
        "cached_wall_seconds": warm_wall,
        "cached_share": warm_wall / cold_wall,
        "cached_cells_reused": reused,
        "peak_worker_rss_mb": max(record.peak_rss_mb or 0 for record in records),
        "parent_cpu_seconds": parent_cpu,
        "parent_cpu_share": parent_cpu / (cold_wall * jobs),
        "statuses": {status: sum(r.status == status for r in records) for status in {r.status for r in records}},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=CLASSES)
    parser.add_argument("--backends", default="dynamo,onnx")
    parser.add_argument("--shapes", default="static,dynamic")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/results.json"))
    parser.add_argument("--private-memory-every", default=str(workers.PRIVATE_MEMORY_EVERY),
                        help="seconds between reads of a worker's private memory; A,B alternates the rounds")
    args = parser.parse_args()
    backends, shapes = tuple(args.backends.split(",")), tuple(args.shapes.split(","))
    classes = select(args.models)
    intervals = [float(value) for value in args.private_memory_every.split(",")]
    warm_imports(backends)
    rounds: dict[float, list[dict]] = {interval: [] for interval in intervals}
    for number in range(args.repeats):
        for interval in intervals:
            workers.PRIVATE_MEMORY_EVERY = interval
            with tempfile.TemporaryDirectory(prefix="export-sweep-bench-") as workspace:
                rounds[interval].append(one_round((classes, backends, shapes), args.jobs, Path(workspace)))
            print(f"round {number + 1}, private memory every {interval:g} s: " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in rounds[interval][-1].items()),
                flush=True)  # fmt: skip
    for interval in intervals:
        report_rounds(args, classes, backends, shapes, interval, rounds[interval], len(intervals) > 1)
    return 0


def report_rounds(args, classes, backends, shapes, interval: float, rounds: list[dict], several: bool) -> None:
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))]
    median = {key: statistics.median(r[key] for r in rounds) for key in keys}
    report = {"classes": [m.name for m in classes], "backends": backends, "shapes": shapes, "jobs": args.jobs,
              "repeats": args.repeats, "private_memory_every": interval, "median": median, "rounds": rounds}  # fmt: skip
    path = args.json.with_name(f"{args.json.stem}-memory-every-{interval:g}{args.json.suffix}") if several else args.json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"private memory read every {interval:g} s:")
    print(f"median over {args.repeats} rounds ({len(classes)} classes, {median['cells']:.0f} cells, "
          f"{args.jobs} workers):")  # fmt: skip
    print(f"  (a) pure stage time        {median['pure_stage_seconds']:.1f} s")
    print(f"  (b) wall time x workers    {median['wall_x_workers']:.1f} s -> overhead ratio "
          f"{median['overhead_ratio']:.3f}, {median['overhead_ms_per_cell']:.0f} ms per cell")  # fmt: skip
    print(f"  (c) fully cached re-run    {median['cached_wall_seconds']:.2f} s = "
          f"{100 * median['cached_share']:.2f}% of the cold run")  # fmt: skip
    print(f"  (d) peak worker memory     {median['peak_worker_rss_mb']:.0f} MB")
    print(f"  (e) parent process CPU     {median['parent_cpu_seconds']:.2f} s = "
          f"{100 * median['parent_cpu_share']:.2f}% of the workers' time")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
