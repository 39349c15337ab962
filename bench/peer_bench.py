"""Our exporters against transformers' own (`transformers.exporters`): the sweep's tiny models and inputs, per backend,
the export call alone timed, both sides in one process, in interleaved rounds.

    .venv/bin/python bench/peer_bench.py --models BertModel,GPT2LMHeadModel --backends dynamo,onnx --rounds 2

Round 1 runs ours then the peer, round 2 the peer then ours, and so on, so warm-up favours neither; before a
backend's first cell each side exports once untimed, as the process's first export pays one-time setup. Both get
the same options: static, or dynamic on the axes the sweep's two input sets vary (`harness.cells.export_options`).
Each export gets its own copy of the model and inputs, as the peer edits both in place. For ExecuTorch the peer's
time includes writing its program to .pte bytes (`.buffer`), which our export does within. A failed export is a
result, kept with its message; the summary compares the cells both sides exported in every round, and its figure per
backend is our summed seconds over the peer's (target: at most 0.8x). The only module here that imports
`transformers.exporters`.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import exporters  # noqa: E402
from harness.cells import ClassContext, export_options  # noqa: E402
from harness.models import select  # noqa: E402
from harness.workers import warm_imports  # noqa: E402

MODELS = ("BertModel,GPT2LMHeadModel,LlamaForCausalLM,ViTForImageClassification,T5ForConditionalGeneration,"
          "WhisperForConditionalGeneration")  # fmt: skip
TARGET_RATIO = 0.8
# backend -> the peer's exporter and config, by their names in transformers.exporters
PEER_CLASSES = {
    "dynamo": ("DynamoExporter", "DynamoConfig"),
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "executorch": ("ExecutorchExporter", "ExecutorchConfig"),
}


def our_export(backend, model, inputs, options):
    exporter, config = exporters.exporter_for(backend, **options)
    return lambda: exporter.export(model, inputs, config)


def peer_export(backend, model, inputs, options):
    import transformers.exporters as peer

    exporter_name, config_name = PEER_CLASSES[backend]
    exporter, config = getattr(peer, exporter_name)(), getattr(peer, config_name)(**options)
    if backend == "executorch":  # its program serializes on first .buffer; ours returns the bytes
        return lambda: exporter.export(model, inputs, config).program.buffer
    return lambda: exporter.export(model, inputs, config)


SIDES = {"ours": our_export, "peer": peer_export}


def timed(side, backend, model, inputs, options) -> dict:
    model, inputs = copy.deepcopy(model), copy.deepcopy(inputs)  # untimed: neither side sees the other's edits
    gc.collect()
    start = None
    try:
        export = SIDES[side](backend, model, inputs, options)
        start = time.perf_counter()
        export()
        return {"status": "pass", "seconds": round(time.perf_counter() - start, 3)}
    except Exception as error:  # a failed export is a result
        message = str(getattr(error, "message", None) or error).strip() or repr(error)
        seconds = None if start is None else round(time.perf_counter() - start, 3)
        return {"status": "fail", "seconds": seconds, "error": f"{type(error).__name__}: {message[:500]}"}


def cell_row(model_name, backend, shape_mode, runs) -> dict:
    """One cell: each side's median seconds if it exported in every round, else its first error."""
    row = {"model": model_name, "backend": backend, "shapes": shape_mode}
    for side, results in runs.items():
        passed = all(result["status"] == "pass" for result in results)
        row[side] = round(statistics.median(result["seconds"] for result in results), 3) if passed else None
        row[f"{side}_error"] = next((result["error"] for result in results if result["status"] != "pass"), None)
    row["ratio"] = round(row["ours"] / row["peer"], 3) if row["ours"] and row["peer"] else None
    return {**row, "runs": runs}


def summarize(cells) -> dict:
    summary = {}
    for backend in dict.fromkeys(cell["backend"] for cell in cells if "backend" in cell):
        rows = [cell for cell in cells if cell.get("backend") == backend]
        both = [row for row in rows if row["ratio"] is not None]
        counts = {"cells": len(rows), "both_exported": len(both),
                  "ours_only": sum(row["ours"] is not None and row["peer"] is None for row in rows),
                  "peer_only": sum(row["ours"] is None and row["peer"] is not None for row in rows)}  # fmt: skip
        if not both:
            summary[backend] = counts
            continue
        ours_sum, peer_sum = sum(row["ours"] for row in both), sum(row["peer"] for row in both)
        summary[backend] = {**counts, "ours_median_s": round(statistics.median(row["ours"] for row in both), 3),
                            "peer_median_s": round(statistics.median(row["peer"] for row in both), 3),
                            "ours_sum_s": round(ours_sum, 3), "peer_sum_s": round(peer_sum, 3),
                            "ratio": round(ours_sum / peer_sum, 3),
                            "median_cell_ratio": round(statistics.median(row["ratio"] for row in both), 3),
                            "meets_target": ours_sum / peer_sum <= TARGET_RATIO}  # fmt: skip
    return summary


def write(args, cells) -> dict:
    summary = summarize(cells)
    settings = {"models": args.models, "backends": args.backends, "shapes": args.shapes, "rounds": args.rounds}
    report = {**settings, "target_ratio": TARGET_RATIO, "versions": exporters.package_versions(), "summary": summary,
              "cells": cells}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))
    return summary


def shown(row, side) -> str:
    return f"{row[side]:8.2f}" if row[side] is not None else f"{'fail':>8}"


def print_report(cells, summary):
    print(f"\n{'model':<34} {'backend':<10} {'shapes':<8} {'ours s':>8} {'peer s':>8} {'ratio':>7}")
    for row in (cell for cell in cells if "backend" in cell):
        ratio = f"{row['ratio']:6.2f}x" if row["ratio"] is not None else ""
        print(f"{row['model']:<34} {row['backend']:<10} {row['shapes']:<8} {shown(row, 'ours')} {shown(row, 'peer')} "
              f"{ratio:>7}")  # fmt: skip
    for backend, figures in summary.items():
        if "ratio" not in figures:
            print(f"{backend}: no cell exported by both ({figures})")
            continue
        print(f"{backend}: {figures['both_exported']}/{figures['cells']} cells both exported; median ours "
              f"{figures['ours_median_s']:.2f} s vs peer {figures['peer_median_s']:.2f} s; sum ours "
              f"{figures['ours_sum_s']:.2f} s vs peer {figures['peer_sum_s']:.2f} s = {figures['ratio']:.2f}x "
              f"(target <= {TARGET_RATIO}x: {'met' if figures['meets_target'] else 'not met'}); "
              f"only ours {figures['ours_only']}, only peer {figures['peer_only']}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--shapes", default="static")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench/peer_bench.json"))
    args = parser.parse_args()
    backends, shape_modes = args.backends.split(","), args.shapes.split(",")
    warm_imports(backends)  # imports and XNNPACK's first lowering are neither side's export
    import transformers.exporters as peer

    for backend in backends:  # the peer's backend modules load on first use: load them before timing
        getattr(peer, PEER_CLASSES[backend][0])
    cells, warmed = [], set()
    for model_class in select(args.models):
        context = ClassContext(model_class).prepare()
        if not context.ok:
            failed = next(stage for stage in context.stages if stage.status != "pass")
            cells.append({"model": model_class.name, "prepare_error": f"{failed.name}: {failed.message}"})
            print(f"{model_class.name}: not prepared ({cells[-1]['prepare_error'][:200]})", flush=True)
            write(args, cells)
            continue
        for backend in backends:
            if backend not in warmed:  # a process's first export of a backend pays one-time setup: untimed, both sides
                for side in SIDES:
                    timed(side, backend, context.model, context.inputs["A"], export_options("static", context.inputs))
                warmed.add(backend)
            for shape_mode in shape_modes:
                options = export_options(shape_mode, context.inputs)
                runs = {"ours": [], "peer": []}
                for number in range(args.rounds):
                    for side in ("ours", "peer") if number % 2 == 0 else ("peer", "ours"):
                        runs[side].append(timed(side, backend, context.model, context.inputs["A"], options))
                row = cell_row(model_class.name, backend, shape_mode, runs)
                cells.append(row)
                errors = "".join(f"; {side} failed: {row[f'{side}_error'][:200]}"
                                 for side in SIDES if row[f"{side}_error"])  # fmt: skip
                print(f"{model_class.name} {backend} {shape_mode}: ours {shown(row, 'ours').strip()} s, "
                      f"peer {shown(row, 'peer').strip()} s{errors}",
                      flush=True)  # fmt: skip
                write(args, cells)  # after each cell: a cut run keeps what it measured
    print_report(cells, write(args, cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
