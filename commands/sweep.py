"""The sweep's commands: ``run``, ``plan``, ``show``, ``merge``, ``report``, and the verdict their exit code carries."""

from __future__ import annotations

import os
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

from exporters.workarounds import disabled_workarounds, ledger
from harness.cache import ResultCache, default_cache_dir
from harness.compare import CHANGE_KINDS, default_fail_on, diff, expected_cells, failing
from harness.console import quiet
from harness.ledger import WORKAROUNDS_FILE, write_listing
from harness.merge import merge_runs
from harness.models import all_model_classes, near_matches
from harness.plan import cell_plan, make_plan, plan_of_run, planned_classes, select_plan
from harness.store import RunStore, now, require_run
from harness.sweep import Progress, run_sweep
from harness.workers import WorkerOptions, warm_imports
from registry import Registry
from reports import write_report

from .inputs import existing_run, one_line, writable_folder


def plan_of(args):
    """The plan and shard index the selection options name."""
    return select_plan(args.models, args.model_types, args.tasks, args.limit, args.sample, args.seed, args.shard,
                       args.shard_weights, args.plan, getattr(args, "backends", None), getattr(args, "shapes", None),
                       getattr(args, "dtypes", None))


def cmd_plan(args) -> int:
    plan, _index = plan_of(args)
    if args.shard:
        raise ValueError("export-sweep plan writes every shard's part: drop --shard, give --shards")
    # the plan selected above has one shard; this one has --shards, from the same classes and weights
    plan = make_plan(planned_classes(plan), plan.backends, plan.shapes, plan.selection, shards=args.shards,
                     weights={name: entry["seconds"] for name, entry in plan.classes.items() if "seconds" in entry},
                     weights_from=plan.weights_from, dtypes=plan.dtypes)  # fmt: skip
    plan.save(args.out)
    sizes = [len(plan.cells(index)) for index in range(1, plan.shards + 1)]
    print(f"{args.out}: {len(plan.classes)} classes, {len(plan.cells())} cells in {plan.shards} shards "
          f"({min(sizes)}-{max(sizes)} cells each), plan {plan.digest}")  # fmt: skip
    return 0


def cmd_run(args) -> int:
    plan, index = plan_of(args)
    classes = planned_classes(plan, index)
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
    out = args.out or Path("runs") / datetime.now().strftime("%Y-%m-%d_%H%M%S")
    cache_dir = None
    if not args.no_cache:
        cache_dir = writable_folder(args.cache_dir or default_cache_dir(), "--cache-dir")
    registry = Registry.load(args.registry)
    cache = None if args.no_cache else ResultCache(cache_dir, registry, salt=_cache_salt(args))
    if args.dry_run:
        return dry_run(plan, classes, cache)
    if args.disable_workarounds:  # before any folder is made
        check_workaround_names(args.disable_workarounds)
    baseline = existing_run(args.baseline, "--baseline")
    writable_folder(out, "--out")
    store = RunStore(out)
    options = {
        "models": args.models, "model_types": args.model_types, "tasks": args.tasks, "limit": args.limit,
        "sample": args.sample, "seed": args.seed, "shard": args.shard, "backends": list(plan.backends),
        "shapes": list(plan.shapes), "dtypes": list(plan.dtypes), "jobs": args.jobs, "timeout": args.timeout, "memory_cap_mb": args.memory_cap,
        "registry": str(registry.path), "disabled_workarounds": args.disable_workarounds, "argv": sys.argv[1:],
    }  # fmt: skip
    store.create(options, resume=args.resume, plan=plan, shard=index)
    done = set()
    if args.resume:
        done = {record.cell_id for record in store.records() if record.status not in args.rerun}
    # cached cells first, from files alone: with nothing left to run, no worker starts and torch is never imported
    reused = Counter()
    for model in classes:
        for cell in cell_plan(plan, [model], done=done).cells(model):
            record = cache.lookup(cell) if cache is not None else None
            if record is not None:
                store.write(record)
                done.add(cell.id)
                reused[record.status] += 1
    sweep = cell_plan(plan, classes, done=done)
    base_records = {record.cell_id: record for record in baseline.records()} if baseline is not None else None
    estimates = {cell: record.seconds for cell, record in (base_records or {}).items()} or plan.estimated_seconds()
    pending = [cell.id for model in classes for cell in sweep.cells(model)]
    print(f"export-sweep: {len(classes)} classes, {sweep.total} cells to run ({len(sweep.done)} already done, "
          f"{sum(reused.values())} of them unchanged since an earlier run) with {args.jobs} workers -> {out}",
          file=sys.stderr)  # fmt: skip
    with quiet(store.logs_dir / "sweep.log", args.verbose) as console:
        counts = Counter(reused)
        if sweep.total:
            warm_imports(plan.backends)
            # the ledger of this run names the code that ran
            write_listing(out, ledger(tuple(plan.backends)))
            worker_options = WorkerOptions(
                timeout=args.timeout, memory_cap_mb=args.memory_cap, log_dir=store.logs_dir,
                threads=max(1, (os.cpu_count() or 1) // args.jobs), disabled_workarounds=tuple(args.disable_workarounds),
            )  # fmt: skip
            progress = Progress(sweep.total, stream=console.err, estimates=estimates, pending=pending)
            started = now()
            try:
                counts += run_sweep(sweep, store, worker_options, args.jobs, registry, progress)
            finally:
                if cache is not None:
                    cache.save_from(store, since=started)
        elif cache is not None:
            cache.copy_listing(out)  # no code ran: the listing of the code that made the cached records
        store.finish(counts=dict(counts))
        console.say(f"export-sweep: {sum(counts.values())} cells: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if not args.no_report:
            site = write_report(out, baseline=args.baseline)
            console.say(f"dashboard: {site / 'index.html'}")
        return verdict(out, base_records, args.fail_on, console)


def dry_run(plan, classes, cache) -> int:
    """How many cells would run, and why each part of the key changed: nothing runs, no model is built."""
    reasons = Counter()
    examples: dict[str, str] = {}
    total = 0
    for model in classes:
        for cell in cell_plan(plan, [model]).cells(model):
            total += 1
            why = "--no-cache" if cache is None else cache.explain(cell)[1]
            if why is not None:
                reasons[why] += 1
                examples.setdefault(why, cell.id)
    print(f"{sum(reasons.values())} of {total} cells would run ({total - sum(reasons.values())} unchanged):")
    for why, count in reasons.most_common():
        print(f"  {count:>6}  {why}  (e.g. {examples[why]})")
    return 0


def _cache_salt(args) -> str:
    """What besides the code and the class changes a cell's result: a run without some workarounds."""
    return ",".join(sorted(args.disable_workarounds))


def check_workaround_names(names: list[str]) -> None:
    try:
        with disabled_workarounds(*names):
            pass
    except KeyError as error:
        raise LookupError(f"--disable-workarounds: {one_line(error)} (export-sweep workarounds lists them)") from None


def verdict(run_dir: Path, baseline_records, fail_on, console=None) -> int:
    """Print the changes against the baseline and the cells of a failing kind; 1 when there are any."""
    say = console.say if console is not None else (lambda text: print(text, file=sys.stderr))
    plan = plan_of_run(run_dir)
    store = RunStore(run_dir)
    unreadable: list[str] = []
    records = {record.cell_id: record for record in store.records(errors=unreadable)}
    changes = diff(records, baseline_records, plan, expected_cells(run_dir, plan))
    for change in changes:  # a record that cannot be read is missing too, and says so
        if change.kind == "missing" and store.path_for(change.cell_id).exists():
            change.detail = "its record cannot be read: " + next((e for e in unreadable if change.cell_id in e), "")
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
    store = require_run(args.run_dir)
    if args.cell not in store.cell_ids():
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
    merged = merge_runs(args.out, args.runs, plan_path=args.plan, say=lambda text: print(text, file=sys.stderr))
    baseline = existing_run(args.baseline, "--baseline")
    base_records = {record.cell_id: record for record in baseline.records()} if baseline is not None else None
    print(f"merged {merged.cells} cells from {len(merged.sources)} shard runs into {args.out}")
    return verdict(args.out, base_records, args.fail_on)


def cmd_report(args) -> int:
    require_run(args.run_dir)
    baseline = existing_run(args.baseline, "--baseline")
    if args.history is not None and not args.history.exists():
        raise FileNotFoundError(f"--history {args.history}: no such folder or nights.json")
    if args.stale is not None and not args.stale.is_file():
        raise FileNotFoundError(f"--stale {args.stale}: no such file")
    if args.out is not None:
        writable_folder(args.out, "--out")
    # a run from before listings is shown with the workarounds of the code installed now
    listing = None if (args.run_dir / WORKAROUNDS_FILE).is_file() else ledger()
    site = write_report(args.run_dir, baseline=args.baseline, history=args.history, out=args.out, stale=args.stale,
                        workarounds=listing)  # fmt: skip
    print(f"dashboard: {site / 'index.html'}")
    base_records = {record.cell_id: record for record in baseline.records(errors=[])} if baseline is not None else None
    return verdict(args.run_dir, base_records, args.fail_on)
