"""A run with nothing to do, as a user starts it: `export-sweep run` on classes x 3 backends, cold (empty cache), then
the same command again, every cell cached. Both are whole command lines (a fresh Python each, imports included),
each round in a fresh cache; the figure is the cached run's wall time as a share of the cold run's, median of rounds.

    .venv/bin/python bench/noop_bench.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("BertModel,DistilBertForSequenceClassification,GPT2LMHeadModel,LlamaForCausalLM,ViTForImageClassification,"
           "ResNetForImageClassification,Wav2Vec2ForCTC,T5ForConditionalGeneration")  # fmt: skip


def timed_run(arguments: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "commands", "run", *arguments], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=CLASSES)
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--shapes", default="static,dynamic")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/noop_results.json"))
    args = parser.parse_args()
    rounds = []
    for number in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="export-sweep-noop-") as workspace:
            common = ["--models", args.models, "--backends", args.backends, "--shapes", args.shapes,
                      "--jobs", str(args.jobs), "--cache-dir", f"{workspace}/cache", "--no-report"]  # fmt: skip
            cold = timed_run([*common, "--out", f"{workspace}/cold"])
            cached = timed_run([*common, "--out", f"{workspace}/cached"])
        rounds.append({"cold_seconds": cold, "cached_seconds": cached, "cached_share": cached / cold})
        print(f"round {number + 1}: cold {cold:.1f} s, cached {cached:.2f} s = {100 * cached / cold:.2f} %", flush=True)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    args.json.write_text(json.dumps({**vars(args), "json": str(args.json), "median": median, "rounds": rounds}, indent=1))
    print(f"median of {args.repeats}: cold {median['cold_seconds']:.1f} s, cached {median['cached_seconds']:.2f} s "
          f"= {100 * median['cached_share']:.2f} % of the cold run")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
