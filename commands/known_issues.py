"""The known issues' commands: ``registry`` (check, add) and ``stale``."""

from __future__ import annotations

import sys

from harness.models import all_model_classes
from registry import Entry, Registry, RegistryError
from registry.stale import run_stale


def cmd_registry(args) -> int:
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
    return run_stale(args)
