"""Today's code against an earlier commit's, cell by cell, in one run on one machine.

    .venv/bin/python bench/against_commit.py --baseline 505fc14 --sample 40 --seed 1 --out bench/against_505fc14.json
    # or in two processes, one per core, then combined:
    ... --shard 1/2 --out a.json & ... --shard 2/2 --out b.json; wait
    .venv/bin/python bench/against_commit.py --combine a.json b.json --out bench/against_505fc14.json

The baseline is checked out in a worktree beside this one (../bench_<sha>). Two long-lived worker processes, one
importing each tree, run the same cells of a seeded sample one at a time, in alternating order from class to class,
so that both see the same machine load. Each worker warms up as a sweep worker does (`warm_imports` of its own
tree). A class' config, tiny model and eager outputs are prepared outside the timing, as in the sweep, where the
class' cells share them. The output holds every cell both ways (status, stage, seconds by stage) and prints, per
backend and shape mode, whether statuses and stages were kept and the to-edge and whole-cell ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from bench.comparison import print_comparison

# Runs in each worker, with its tree first on sys.path: uses only the harness API both trees have.
WORKER = r"""
import json, signal, sys, time
sys.path.insert(0, sys.argv[1])
from harness.cells import Cell, ClassContext, run_cell
from harness.models import all_model_classes
from harness.workers import warm_imports

class CellTimeout(Exception):
    pass

def alarm(signum, frame):
    raise CellTimeout()

signal.signal(signal.SIGALRM, alarm)
warm_imports(json.loads(sys.argv[2]))
models = all_model_classes()
context = None  # the class' shared stages, kept for its next cells
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    if context is None or context.model_class.name != ask["model"]:
        context = ClassContext(models[ask["model"]]).prepare()
    start = time.perf_counter()
    signal.alarm(ask["timeout"])
    try:
        record = run_cell(Cell(context.model_class, ask["backend"], ask["shape_mode"]), context)
        answer = {"status": record.status, "stage": record.stage, "stages": {s.name: s.seconds for s in record.stages}}
    except CellTimeout:
        answer = {"status": "timeout", "stage": None, "stages": {}}
    finally:
        signal.alarm(0)
    answer["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(answer), flush=True)
"""


class Worker:
    """One Python process importing one tree, asked for one cell at a time."""

    def __init__(self, tree: Path, backends: list[str]):
        self.tree = tree
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), json.dumps(backends)], cwd=tree,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        self._answer()

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker of {self.tree} exited ({self.process.wait()}); its stderr is above")
        return json.loads(line)

    def run(self, model: str, backend: str, shape_mode: str, timeout: int) -> dict:
        ask = {"model": model, "backend": backend, "shape_mode": shape_mode, "timeout": timeout}
        self.process.stdin.write(json.dumps(ask) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def baseline_tree(sha: str) -> tuple[Path, str]:
    full = subprocess.run(["git", "-C", str(HERE), "rev-parse", sha], capture_output=True, text=True, check=True)
    full_sha = full.stdout.strip()
    tree = HERE.parent / f"bench_{full_sha[:7]}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", str(tree), full_sha], check=True)
    return tree, full_sha


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="the earlier commit (any git revision)")
    parser.add_argument("--sample", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--backends", default="executorch")
    parser.add_argument("--shapes", default="static,dynamic")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--shard", default="1/1", help="i/n: every n-th class of the sample, from the i-th")
    parser.add_argument("--combine", type=Path, nargs="+", help="join these outputs instead of running")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.combine:
        parts = [json.loads(path.read_text()) for path in args.combine]
        if len({(part["baseline"], part["head"]) for part in parts}) != 1:
            sys.exit("these outputs compare different commits")
        write(args.out, {**parts[0], "cells": [cell for part in parts for cell in part["cells"]]})
        return
    if not args.baseline:
        parser.error("--baseline is required unless --combine")
    from harness.models import select

    tree, baseline_sha = baseline_tree(args.baseline)
    head = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    backends, shapes = args.backends.split(","), args.shapes.split(",")
    index, count = map(int, args.shard.split("/"))
    models = [model.name for model in select("all", sample=args.sample, seed=args.seed)][index - 1 :: count]
    workers = {"before": Worker(tree, backends), "after": Worker(HERE, backends)}
    output = {"baseline": baseline_sha, "head": head.stdout.strip(), "sample": args.sample, "seed": args.seed,
              "cells": []}  # fmt: skip
    for number, model in enumerate(models):
        for backend in backends:
            for shape_mode in shapes:
                for variant in ["before", "after"][:: 1 - 2 * (number % 2)]:
                    answer = workers[variant].run(model, backend, shape_mode, args.timeout)
                    output["cells"].append({"cell": f"{model}-{backend}-{shape_mode}", "backend": backend,
                                            "shape_mode": shape_mode, "variant": variant, **answer})  # fmt: skip
                    print(f"{model}-{backend}-{shape_mode} {variant}: {answer['status']} {answer['seconds']} s",
                          flush=True)  # fmt: skip
                    write(args.out, output, quiet=True)  # after each cell: a cut run keeps what it measured
    for worker in workers.values():
        worker.close()
    write(args.out, output)


def write(path: Path, output: dict, quiet: bool = False) -> None:
    path.write_text(json.dumps(output, indent=1))
    if not quiet:
        print(f"{output['baseline'][:7]} (before) against {output['head'][:7]} (after)")
        print_comparison(output["cells"])


if __name__ == "__main__":
    main()
