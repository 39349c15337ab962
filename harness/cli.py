"""``export-sweep``: run the sweep, look at a cell, merge shards, render the dashboard, keep the registry honest."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from datetime import datetime
from pathlib import Path

from exporters.backends import BACKENDS

from .records import SHAPE_MODES

DEFAULT_SHAPES = ("static", "dynamic")


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


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smoke", help="smoke (default), all, or class names and globs, comma-separated")
    parser.add_argument("--model-types", type=_list, help="only these model types (comma-separated)")
    parser.add_argument("--tasks", type=_list, help="only classes in these tasks, e.g. causal-lm,image-classification")
    parser.add_argument("--limit", type=int, help="at most this many classes")
    parser.add_argument("--shard", help="run shard i of N (i/N), balanced by the previous run's class times")
    parser.add_argument("--shard-weights", type=Path, help="run folder whose class times balance the shards")
    parser.add_argument("--registry", type=Path, help="another registry file (default: registry/known_issues.toml)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="export-sweep", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the sweep (default: the smoke set, all backends, static+dynamic)")
    add_selection_options(run)
    run.add_argument("--backends", type=_csv(BACKENDS), default=BACKENDS, help="comma-separated; default all")
    run.add_argument("--shapes", type=_csv(SHAPE_MODES), default=DEFAULT_SHAPES, help="static,dynamic (default), generate")
    run.add_argument("--out", type=Path, help="run folder (default runs/<date-time>)")
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="classes in parallel (default: CPU count)")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds per cell before it is killed (default 600)")
    run.add_argument("--memory-cap", type=float, help="MB of resident memory per worker before it is killed")
    run.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished cells")
    run.add_argument("--rerun", type=_csv(("fail", "timeout", "crash", "oom", "unavailable", "skip")), default=(),
                     help="with --resume, run again the cells that ended with these statuses, e.g. timeout,crash")
    run.add_argument("--list", action="store_true", help="print the selected classes and their count, run nothing")
    run.add_argument("--no-cache", action="store_true", help="run every cell, even when an earlier result still holds")
    run.add_argument("--cache-dir", type=Path, help="where reusable results live (default ~/.cache/export-sweep)")
    run.add_argument("--baseline", type=Path, help="earlier run to compare against in the dashboard")
    run.add_argument("--no-report", action="store_true", help="do not write the dashboard at the end")

    show = commands.add_parser("show", help="one cell's record and a command that reproduces it")
    show.add_argument("run_dir", type=Path)
    show.add_argument("cell", help="cell id like LlamaForCausalLM-onnx-dynamic")

    merge = commands.add_parser("merge", help="combine shard run folders into one")
    merge.add_argument("out", type=Path)
    merge.add_argument("runs", type=Path, nargs="+")

    report = commands.add_parser("report", help="write the dashboard of a run")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--baseline", type=Path, help="earlier run: regressions and new passes against it")
    report.add_argument("--history", type=Path, help="folder of earlier runs: pass-rate trends")
    report.add_argument("-o", "--out", type=Path, help="site folder (default RUN_DIR/site)")
    report.add_argument("--stale", type=Path, help="stale-check JSON to show on the registry page")

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
    stale.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    stale.add_argument("--timeout", type=float, default=600.0)
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
    handlers = {"run": cmd_run, "show": cmd_show, "merge": cmd_merge, "report": cmd_report, "registry": cmd_registry,
                "stale": cmd_stale}  # fmt: skip
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; run again with --resume", file=sys.stderr)
        return 130
    except (LookupError, ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"export-sweep {args.command}: {error}", file=sys.stderr)
        return 2


def select_classes(args):
    from .models import parse_shard, select, shard

    classes = select(args.models, args.model_types, args.tasks, args.limit)
    if args.shard:
        index, count = parse_shard(args.shard)
        from .cache import class_weights

        classes = shard(classes, index, count, class_weights(getattr(args, "shard_weights", None)))
    return classes


def cmd_run(args) -> int:
    from .models import all_model_classes

    classes = select_classes(args)
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
    return execute_run(args, classes)


def execute_run(args, classes) -> int:
    from registry import Registry

    from .cache import ResultCache
    from .store import RunStore, now
    from .sweep import Plan, Progress, run_sweep
    from .workers import WorkerOptions, warm_imports

    out = args.out or Path("runs") / datetime.now().strftime("%Y-%m-%d_%H%M%S")
    store = RunStore(out)
    registry = Registry.load(args.registry)
    options = {
        "models": args.models, "model_types": args.model_types, "tasks": args.tasks, "limit": args.limit,
        "shard": args.shard, "backends": list(args.backends), "shapes": list(args.shapes), "jobs": args.jobs,
        "timeout": args.timeout, "memory_cap_mb": args.memory_cap, "registry": str(registry.path),
        "argv": sys.argv[1:],
    }  # fmt: skip
    store.create(options, resume=args.resume)
    done = set()
    if args.resume:
        done = {record.cell_id for record in store.records() if record.status not in args.rerun}
    plan = Plan(classes, tuple(args.backends), tuple(args.shapes), done=done)
    jobs = max(1, args.jobs)
    print(
        f"export-sweep: {len(classes)} classes, {plan.total} cells to run "
        f"({len(plan.done)} already done) with {jobs} workers -> {out}",
        file=sys.stderr,
    )
    warm_imports(args.backends)
    cache = None if args.no_cache else ResultCache(args.cache_dir, registry)
    worker_options = WorkerOptions(
        timeout=args.timeout, memory_cap_mb=args.memory_cap, threads=max(1, (os.cpu_count() or 1) // jobs),
        log_dir=out / "logs",
    )  # fmt: skip
    progress = Progress(plan.total)
    started = now()
    try:
        counts = run_sweep(plan, store, worker_options, jobs, registry, progress, reuse=cache.lookup if cache else None)
    finally:
        if cache is not None:
            cache.save_from(store, since=started)
    store.finish(counts=dict(counts))
    print(f"export-sweep: {sum(counts.values())} cells: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if not args.no_report:
        from reports import write_report

        site = write_report(out, baseline=args.baseline)
        print(f"dashboard: {site / 'index.html'}")
    return 0


def cmd_show(args) -> int:
    from .store import RunStore

    store = RunStore(args.run_dir)
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
    from .store import RunStore, write_json_atomic

    out = RunStore(args.out)
    if out.cell_ids():
        raise FileExistsError(f"{args.out} already holds cell records: merge into an empty folder")
    sources = [RunStore(path) for path in args.runs]
    seen: dict[str, Path] = {}
    metadata = []
    for source in sources:
        metadata.append(source.metadata())
        for record in source.records():
            if record.cell_id in seen:
                raise ValueError(f"cell {record.cell_id} is in both {seen[record.cell_id]} and {source.directory}")
            seen[record.cell_id] = source.directory
            out.write(record)
        logs = source.directory / "logs"
        if logs.is_dir():
            shutil.copytree(logs, args.out / "logs", dirs_exist_ok=True)
    merged = dict(metadata[0])
    merged["started_at"] = min(m.get("started_at", "") for m in metadata)
    merged["finished_at"] = max(m.get("finished_at", "") or "" for m in metadata) or None
    merged["shards"] = [{"dir": str(s.directory), **{k: m.get(k) for k in ("started_at", "finished_at", "options")}} for s, m in zip(sources, metadata)]
    write_json_atomic(args.out / "run.json", merged)
    print(f"merged {len(seen)} cells from {len(sources)} runs into {args.out}")
    return 0


def cmd_report(args) -> int:
    from reports import write_report

    site = write_report(args.run_dir, baseline=args.baseline, history=args.history, out=args.out, stale=args.stale)
    print(f"dashboard: {site / 'index.html'}")
    return 0


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
