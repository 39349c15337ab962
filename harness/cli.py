"""``export-sweep``: run the sweep, look at a cell, merge shards, render the dashboard, keep the registry honest.

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
import tempfile
from datetime import datetime
from pathlib import Path

from exporters.backends import BACKENDS

from .compare import CHANGE_KINDS, default_fail_on, diff, expected_cells, failing
from .records import SHAPE_MODES

DEFAULT_SHAPES = ("static", "dynamic")


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
    run.add_argument("--out", type=Path, help="run folder (default runs/<date-time>)")
    run.add_argument("--jobs", type=_whole(1), default=os.cpu_count() or 1, help="classes in parallel (default: CPU count)")
    run.add_argument("--timeout", type=_positive, default=600.0, help="seconds per cell before it is killed (default 600)")
    run.add_argument("--memory-cap", type=_positive, help="MB of memory per cell's worker before it is killed (oom)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished cells")
    run.add_argument("--rerun", type=_csv(("fail", "timeout", "crash", "oom", "unavailable", "skip")), default=(),
                     help="with --resume, run again the cells that ended with these statuses, e.g. timeout,crash")
    run.add_argument("--list", action="store_true", help="print the selected classes and their count, run nothing")
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
    handlers = {"run": cmd_run, "plan": cmd_plan, "show": cmd_show, "merge": cmd_merge, "report": cmd_report,
                "registry": cmd_registry, "stale": cmd_stale}  # fmt: skip
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; run again with --resume", file=sys.stderr)
        return 130
    except (LookupError, ValueError, OSError) as error:  # bad input, named by whoever found it; never a traceback
        print(f"export-sweep {args.command}: {_one_line(error)}", file=sys.stderr)
        return 2


def _one_line(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename is not None else error.strerror
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return text.strip() or type(error).__name__


# ── Inputs, checked before anything runs ─────────────────────────────────────


def writable_folder(path: Path, what: str) -> Path:
    """``path`` as a folder we can write into (created if need be), or an error that names the option."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as error:
        raise OSError(f"{what} {path}: cannot write there ({error.strerror or error})") from None
    return path


def existing_run(path: Path | None, what: str):
    """The store of a run folder given as an option; a path that is not one is named, never ignored."""
    if path is None:
        return None
    from .store import require_run

    return require_run(path, what)


def select_plan(args, backends=None, shapes=None):
    """``(plan, shard index or None)``: from ``--plan``, or made here from the selection options (``backends`` and
    ``shapes`` None: the plan's, or the defaults)."""
    from .models import all_model_classes, parse_shard, select
    from .plan import SweepPlan, make_plan

    index = count = None
    if args.shard:
        index, count = parse_shard(args.shard)
    if args.plan:
        given = [f"--{name.replace('_', '-')}" for name in ("model_types", "tasks", "sample", "limit", "shard_weights")
                 if getattr(args, name, None)] + (["--models"] if args.models not in ("smoke", "all") else [])  # fmt: skip
        if given:
            raise ValueError(f"--plan says which classes run: drop {', '.join(given)}")
        plan = SweepPlan.load(args.plan)
        if count is not None and count != plan.shards:
            raise ValueError(f"--shard {args.shard}: the plan {args.plan} has {plan.shards} shards")
        if plan.shards > 1 and index is None:
            raise ValueError(f"the plan {args.plan} has {plan.shards} shards: say which with --shard i/{plan.shards}")
        if (backends and set(backends) != set(plan.backends)) or (shapes and set(shapes) != set(plan.shapes)):
            raise ValueError(
                f"the plan {args.plan} is for backends {','.join(plan.backends)} and shapes {','.join(plan.shapes)}: "
                "drop --backends/--shapes, or make another plan"
            )
        known = all_model_classes()
        gone = [name for name in plan.class_names(index) if name not in known]
        if gone:
            raise LookupError(
                f"the plan {args.plan} names {len(gone)} classes the installed transformers does not have "
                f"({', '.join(gone[:5])}): it was made with other versions; make the plan where the shards run"
            )
        return plan, index
    selection = {"models": args.models, "model_types": args.model_types, "tasks": args.tasks, "limit": args.limit,
                 "sample": args.sample, "seed": args.seed}  # fmt: skip
    classes = select(args.models, args.model_types, args.tasks, args.limit, args.sample, args.seed)
    weights, weights_from = {}, None
    if args.shard_weights is not None:
        from .cache import class_weights

        existing_run(args.shard_weights, "--shard-weights")
        weights, weights_from = class_weights(args.shard_weights), str(args.shard_weights)
    plan = make_plan(classes, backends or BACKENDS, shapes or DEFAULT_SHAPES, selection, shards=count or 1,
                     weights=weights, weights_from=weights_from)  # fmt: skip
    return plan, index


def _classes_of(plan, index):
    from .models import all_model_classes

    known = all_model_classes()
    return [known[name] for name in plan.class_names(index)]


# ── Commands ─────────────────────────────────────────────────────────────────


def cmd_plan(args) -> int:
    plan, _index = select_plan(args, args.backends, args.shapes)
    if args.shard:
        raise ValueError("export-sweep plan writes every shard's part: drop --shard, give --shards")
    from .plan import make_plan

    # the plan selected above has one shard; this one has --shards, from the same classes and weights
    plan = make_plan(_classes_of(plan, None), plan.backends, plan.shapes, plan.selection, shards=args.shards,
                     weights={name: entry["seconds"] for name, entry in plan.classes.items() if "seconds" in entry},
                     weights_from=plan.weights_from)  # fmt: skip
    plan.save(args.out)
    sizes = [len(plan.cells(index)) for index in range(1, plan.shards + 1)]
    print(f"{args.out}: {len(plan.classes)} classes, {len(plan.cells())} cells in {plan.shards} shards "
          f"({min(sizes)}-{max(sizes)} cells each), plan {plan.digest}")  # fmt: skip
    return 0


def cmd_run(args) -> int:
    from .models import all_model_classes

    plan, index = select_plan(args, args.backends, args.shapes)
    classes = _classes_of(plan, index)
    if args.list:
        everything = all_model_classes()
        mapped = sum(1 for model in everything.values() if model.in_auto_mappings)
        for model in classes:
            print(f"{model.name}\t{model.model_type}\t{','.join(model.tasks)}")
        print(
            f"{len(classes)} classes selected, of {len(everything)} in transformers "
            f"({mapped} from the auto mappings, {len(everything) - mapped} more public PreTrainedModel subclasses)"
        )
        return 0
    return execute_run(args, plan, index, classes)


def execute_run(args, plan, index, classes) -> int:
    from registry import Registry

    from .cache import ResultCache
    from .console import quiet
    from .store import RunStore, now
    from .sweep import Plan, Progress, run_sweep
    from .workers import WorkerOptions, warm_imports

    out = args.out or Path("runs") / datetime.now().strftime("%Y-%m-%d_%H%M%S")
    writable_folder(out, "--out")
    cache_dir = None
    if not args.no_cache:
        from .cache import default_cache_dir

        cache_dir = writable_folder(args.cache_dir or default_cache_dir(), "--cache-dir")
    baseline = existing_run(args.baseline, "--baseline")
    registry = Registry.load(args.registry)
    if args.disable_workarounds:
        check_workaround_names(args.disable_workarounds)
    store = RunStore(out)
    options = {
        "models": args.models, "model_types": args.model_types, "tasks": args.tasks, "limit": args.limit,
        "sample": args.sample, "seed": args.seed, "shard": args.shard, "backends": list(plan.backends),
        "shapes": list(plan.shapes), "jobs": args.jobs, "timeout": args.timeout, "memory_cap_mb": args.memory_cap,
        "registry": str(registry.path), "disabled_workarounds": args.disable_workarounds, "argv": sys.argv[1:],
    }  # fmt: skip
    store.create(options, resume=args.resume, plan=plan, shard=index)
    done = set()
    if args.resume:
        done = {record.cell_id for record in store.records() if record.status not in args.rerun}
    sweep = Plan(classes, tuple(plan.backends), tuple(plan.shapes), done=done)
    base_records = {record.cell_id: record for record in baseline.records()} if baseline is not None else None
    estimates = {cell: record.seconds for cell, record in (base_records or {}).items()} or plan.estimated_seconds()
    pending = [cell.id for model in classes for cell in sweep.cells(model)]
    print(f"export-sweep: {len(classes)} classes, {sweep.total} cells to run ({len(sweep.done)} already done) "
          f"with {args.jobs} workers -> {out}", file=sys.stderr)  # fmt: skip
    with quiet(out / "logs" / "sweep.log", args.verbose) as console:
        warm_imports(plan.backends)
        cache = None if args.no_cache else ResultCache(cache_dir, registry, salt=_cache_salt(args))
        worker_options = WorkerOptions(
            timeout=args.timeout, memory_cap_mb=args.memory_cap, threads=max(1, (os.cpu_count() or 1) // args.jobs),
            log_dir=out / "logs", disabled_workarounds=tuple(args.disable_workarounds),
        )  # fmt: skip
        progress = Progress(sweep.total, stream=console.err, estimates=estimates, pending=pending)
        started = now()
        try:
            counts = run_sweep(sweep, store, worker_options, args.jobs, registry, progress,
                               reuse=cache.lookup if cache else None)  # fmt: skip
        finally:
            if cache is not None:
                cache.save_from(store, since=started)
        store.finish(counts=dict(counts))
        console.say(f"export-sweep: {sum(counts.values())} cells: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if not args.no_report:
            from reports import write_report

            site = write_report(out, baseline=args.baseline)
            console.say(f"dashboard: {site / 'index.html'}")
        return verdict(out, base_records, args.fail_on, console)


def _cache_salt(args) -> str:
    """What besides the code and the class changes a cell's result: a run without some workarounds."""
    return ",".join(sorted(args.disable_workarounds))


def check_workaround_names(names: list[str]) -> None:
    from exporters.workarounds import disabled_workarounds

    try:
        with disabled_workarounds(*names):
            pass
    except KeyError as error:
        raise LookupError(f"--disable-workarounds: {_one_line(error)} (export-sweep workarounds lists them)") from None


def verdict(run_dir: Path, baseline_records, fail_on, console=None) -> int:
    """Print the changes against the baseline and the cells of a failing kind; 1 when there are any."""
    from .plan import plan_of_run
    from .store import RunStore

    say = console.say if console is not None else (lambda text: print(text, file=sys.stderr))
    plan = plan_of_run(run_dir)
    records = {record.cell_id: record for record in RunStore(run_dir).records(errors=[])}
    changes = diff(records, baseline_records, plan, expected_cells(run_dir, plan))
    kinds = fail_on or default_fail_on(baseline_records is not None)
    counts = {kind: sum(change.kind == kind for change in changes) for kind in CHANGE_KINDS}
    if baseline_records is not None:
        say("changes against the baseline: " + ", ".join(f"{kind} {n}" for kind, n in counts.items() if n))
    bad = failing(changes, kinds)
    if not bad:
        return 0
    say(f"export-sweep: {len(bad)} cells are {' / '.join(kinds)} (exit 1):")
    for change in bad[:200]:
        say(f"  {change.kind:<12} {change.cell_id}  {change.detail}")
    if len(bad) > 200:
        say(f"  ... and {len(bad) - 200} more (the Changes page lists them all)")
    return 1


def cmd_show(args) -> int:
    from .store import require_run

    store = require_run(args.run_dir)
    if args.cell not in store.cell_ids():
        from .models import near_matches

        hint = near_matches(args.cell, store.cell_ids())
        raise LookupError(f"no cell {args.cell!r} in {args.run_dir}" + (f"; did you mean {', '.join(hint)}?" if hint else ""))
    record = store.read(args.cell)
    print(f"{record.cell_id}: {record.status} at {record.stage} ({record.seconds:.1f} s)")
    print(f"  class {record.model_class} ({record.model_type}, {record.task}), inputs {record.input_set}")
    for stage in record.stages:
        mark = {"pass": "ok", "skip": "--"}.get(stage.status, "XX")
        print(f"  [{mark}] {stage.name:<20} {stage.seconds:8.2f} s  {stage.status}")
        if stage.message and stage.status != "pass":
            print("       " + stage.message.splitlines()[0][:300])
    if record.max_abs_diff is not None:  # a generation cell compares logits but keeps no relative difference
        relative = "" if record.max_rel_diff is None else f", max rel {record.max_rel_diff:.3g}"
        print(f"  parity: max abs {record.max_abs_diff:.3g}{relative} (atol {record.atol:g}, rtol {record.rtol:g})")
    if record.applied:
        print(f"  workarounds applied: {', '.join(record.applied)}")
    if record.registry:
        print(f"  registry: {record.registry.get('list')} {record.registry.get('scope')}: {record.registry.get('url')}")
    print(f"  repro: {record.repro}")
    return 0


def cmd_merge(args) -> int:
    from .merge import merge_runs

    merged = merge_runs(args.out, args.runs, plan_path=args.plan, say=lambda text: print(text, file=sys.stderr))
    baseline = existing_run(args.baseline, "--baseline")
    base_records = {record.cell_id: record for record in baseline.records()} if baseline is not None else None
    print(f"merged {merged.cells} cells from {len(merged.sources)} shard runs into {args.out}")
    return verdict(args.out, base_records, args.fail_on)


def cmd_report(args) -> int:
    from reports import write_report

    from .store import require_run

    require_run(args.run_dir)
    baseline = existing_run(args.baseline, "--baseline")
    if args.history is not None and not args.history.is_dir():
        raise FileNotFoundError(f"--history {args.history}: no such folder")
    if args.stale is not None and not args.stale.is_file():
        raise FileNotFoundError(f"--stale {args.stale}: no such file")
    if args.out is not None:
        writable_folder(args.out, "--out")
    site = write_report(args.run_dir, baseline=args.baseline, history=args.history, out=args.out, stale=args.stale)
    print(f"dashboard: {site / 'index.html'}")
    base_records = {record.cell_id: record for record in baseline.records(errors=[])} if baseline is not None else None
    return verdict(args.run_dir, base_records, args.fail_on)


def cmd_registry(args) -> int:
    from registry import Entry, Registry, RegistryError

    from .models import all_model_classes

    try:
        registry = Registry.load(args.registry)
        if args.registry_command == "check":
            problems = registry.check(all_model_classes())
            for problem in problems:
                print(problem, file=sys.stderr)
            print(f"{registry.path}: {len(registry.entries)} entries, {len(problems)} problems")
            return 1 if problems else 0
        entry = Entry(args.list, args.model, args.scope, args.reason, args.url, args.fixed_when)
        added = registry.add(entry, known_classes=all_model_classes())
        print(f"{registry.path}:{added.line}: added {added.label()}")
        return 0
    except RegistryError as error:
        print(f"export-sweep registry: {error}", file=sys.stderr)
        return 2


def cmd_stale(args) -> int:
    from registry.stale import run_stale

    return run_stale(args)


if __name__ == "__main__":
    sys.exit(main())
