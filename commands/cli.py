"""``export-sweep``: run the sweep, look at a cell, merge shards, render the dashboard, keep the known issues honest.

Exit codes: 0 nothing the run fails on; 1 cells of a ``--fail-on`` kind (regressions, missing cells, new failures
against a baseline), or stale entries with ``stale --strict``; 2 bad options or input, named on one line;
130 interrupted (finished cells are kept).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path

from exporters.backends import BACKENDS
from harness.compare import CHANGE_KINDS
from harness.records import DTYPES, SHAPE_MODES

from . import known_issues, sweep
from .inputs import one_line


class CommandParser(argparse.ArgumentParser):
    """Bad options end in one line naming the option and what it takes, and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _csv(choices):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)} (comma-separated)")
        return values

    return parse


def _list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _whole(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below the least allowed, {minimum}")
        return value

    return parse


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number above 0")
    return value


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("export-sweep")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smoke", help="smoke (default), all, or class names and globs, comma-separated")
    parser.add_argument("--model-types", type=_list, help="only these model types (comma-separated)")
    parser.add_argument("--tasks", type=_list, help="only classes in these tasks, e.g. causal-lm,image-classification")
    parser.add_argument("--sample", type=_whole(1), help="this many of the selected classes, drawn at random with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0: the same sample every time)")
    parser.add_argument("--limit", type=_whole(1), help="at most this many classes (the first ones)")
    parser.add_argument("--shard", help="run shard i of N (i/N), balanced by --shard-weights or as the --plan says")
    parser.add_argument("--shard-weights", type=Path, help="run folder whose class times balance the shards")
    parser.add_argument("--plan", type=Path, help="plan file (export-sweep plan) that says which classes each shard runs")
    parser.add_argument("--registry", type=Path, help="another registry file (default: registry/known_issues.toml)")


def add_verdict_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fail-on", type=_csv(CHANGE_KINDS), metavar="KINDS",
                        help="exit 1 when a cell has one of these change kinds (default: regression,missing,new-failure "
                             "against a baseline; missing without one)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="export-sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"export-sweep {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the sweep (default: the smoke set, all backends, static+dynamic)")
    add_selection_options(run)
    run.add_argument("--backends", type=_csv(BACKENDS), help="comma-separated; default all (or the --plan's)")
    run.add_argument("--shapes", type=_csv(SHAPE_MODES), help="static,dynamic (default, or the --plan's), generate")
    run.add_argument("--dtypes", type=_csv(DTYPES), help="float32 (default, or the --plan's), bfloat16, float16")
    run.add_argument("--out", type=Path, help="run folder (default runs/<date-time>)")
    run.add_argument("--jobs", type=_whole(1), default=os.cpu_count() or 1, help="classes in parallel (default: CPU count)")
    run.add_argument("--timeout", type=_positive, default=600.0, help="seconds per cell before it is killed (default 600)")
    run.add_argument("--memory-cap", type=_positive, help="MB of memory per cell's worker before it is killed (oom)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished cells")
    run.add_argument("--rerun", type=_csv(("fail", "timeout", "crash", "oom", "unavailable", "skip")), default=(),
                     help="with --resume, run again the cells that ended with these statuses, e.g. timeout,crash")
    run.add_argument("--list", action="store_true", help="print the selected classes and their count, run nothing")
    run.add_argument("--dry-run", action="store_true", help="say how many cells would run and why, run nothing")
    run.add_argument("--no-cache", action="store_true", help="run every cell, even when an earlier result still holds")
    run.add_argument("--cache-dir", type=Path, help="where reusable results live (default ~/.cache/export-sweep)")
    run.add_argument("--baseline", type=Path, help="earlier run to compare against: the changes, the exit code, the ETA")
    run.add_argument("--disable-workarounds", type=_list, default=[], metavar="NAMES",
                     help="run without these registered workarounds (shows the cells they protect)")
    run.add_argument("--no-report", action="store_true", help="do not write the dashboard at the end")
    run.add_argument("--verbose", action="store_true", help="show library output (otherwise in RUN/logs/sweep.log)")
    add_verdict_options(run)

    plan = commands.add_parser("plan", help="write the plan of a sharded sweep, once, for every shard to read")
    add_selection_options(plan)
    plan.add_argument("--backends", type=_csv(BACKENDS), help="comma-separated; default all")
    plan.add_argument("--shapes", type=_csv(SHAPE_MODES), help="static,dynamic (default), generate")
    plan.add_argument("--dtypes", type=_csv(DTYPES), help="float32 (default), bfloat16, float16")
    plan.add_argument("--shards", type=_whole(1), required=True, help="how many shards")
    plan.add_argument("-o", "--out", type=Path, required=True, help="the plan file to write")

    show = commands.add_parser("show", help="one cell's record and a command that reproduces it")
    show.add_argument("run_dir", type=Path)
    show.add_argument("cell", help="cell id like LlamaForCausalLM-onnx-dynamic")

    merge = commands.add_parser("merge", help="combine shard run folders into one (all or nothing)")
    merge.add_argument("out", type=Path)
    merge.add_argument("runs", type=Path, nargs="+")
    merge.add_argument("--plan", type=Path, help="the plan the shards ran (default: the one they carry)")
    merge.add_argument("--baseline", type=Path, help="earlier run to compare the merged run against")
    add_verdict_options(merge)

    report = commands.add_parser("report", help="write the dashboard of a run")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--baseline", type=Path, help="earlier run: the changes against it")
    report.add_argument("--history", type=Path, help="folder of earlier runs: pass-rate trends")
    report.add_argument("-o", "--out", type=Path, help="site folder (default RUN_DIR/site)")
    report.add_argument("--stale", type=Path, help="stale-check JSON to show on the registry page")
    add_verdict_options(report)

    registry = commands.add_parser("registry", help="check or extend the known-issue registry")
    registry_commands = registry.add_subparsers(dest="registry_command", required=True)
    check = registry_commands.add_parser("check", help="validate every entry")
    check.add_argument("--registry", type=Path)
    add = registry_commands.add_parser("add", help="append a validated entry")
    add.add_argument("--registry", type=Path)
    add.add_argument("--list", required=True, choices=("EXPORT_SKIPS", "ONNX_DISABLE_OPTIMIZE"))
    add.add_argument("--scope", required=True)
    add.add_argument("--model", required=True)
    add.add_argument("--reason", required=True)
    add.add_argument("--url", required=True)
    add.add_argument("--fixed-when", help="version condition that should fix it, like onnxscript>0.7.2")

    stale = commands.add_parser("stale", help="find registry entries that are no longer needed")
    add_selection_options(stale)
    stale.set_defaults(models="all")
    stale.add_argument("--offline", action="store_true", help="skip the GitHub check")
    stale.add_argument("--json", type=Path, help="write the findings here as JSON")
    stale.add_argument("--fix", action="store_true", help="rewrite the registry without the entries that pass now")
    stale.add_argument("--strict", action="store_true", help="exit 1 when anything is stale")
    stale.add_argument("--jobs", type=_whole(1), default=os.cpu_count() or 1)
    stale.add_argument("--timeout", type=_positive, default=600.0)
    stale.add_argument("--out", type=Path, help="run folder for the re-run cells (default: a temporary one)")
    stale.add_argument("--cache-dir", type=Path, help="where GitHub answers are cached")
    stale.add_argument("--workarounds", action="store_true", help="judge the workarounds too, re-running cells without each")
    stale.add_argument("--run", type=Path, help="with --workarounds: the run whose cells each workaround fired on")
    stale.add_argument("--names", type=_list, help="with --workarounds: only these workarounds (comma-separated)")
    stale.add_argument("--per-workaround", type=_whole(1), default=2, metavar="K",
                       help="cells re-run without each workaround, cheapest first (default 2)")
    stale.add_argument("--budget-minutes", type=_positive, help="stop re-running after this long; the rest: not checked")

    workarounds = commands.add_parser("workarounds", help="the ledger: every workaround, what it waits for, where it fired")
    workarounds.add_argument("run_dir", type=Path, nargs="?", help="a run: the cells each workaround fired on")
    workarounds.add_argument("--backends", type=_csv(BACKENDS), help="only these backends' workarounds")
    workarounds.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _stop(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    # A stop request (Ctrl-C, a CI job cancelled with SIGTERM, also when started in the background with SIGINT
    # ignored) ends the sweep cleanly: workers are closed and every finished cell stays on disk.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"run": sweep.cmd_run, "plan": sweep.cmd_plan, "show": sweep.cmd_show, "merge": sweep.cmd_merge,
                "report": sweep.cmd_report, "registry": known_issues.cmd_registry, "stale": known_issues.cmd_stale,
                "workarounds": known_issues.cmd_workarounds}  # fmt: skip
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; run again with --resume", file=sys.stderr)
        return 130
    except (LookupError, ValueError, OSError) as error:  # bad input, named by whoever found it; never a traceback
        print(f"export-sweep {args.command}: {one_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
