"""A quiet console: the sweep's own lines (progress, summary, verdict) on the terminal, library noise in the run's log.

torch, transformers, torchao and the backends print on import and while building models (shared libraries that
fail to load, deprecations, config warnings), from Python and from C++. ``quiet`` points the process' file
descriptors 1 and 2 at the run's log for the duration, so every such line lands there whoever writes it, and hands
out streams on the terminal for what the sweep itself says. ``--verbose`` leaves everything on the terminal.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO


class Console:
    """Where the command's own lines go: ``out`` for results, ``err`` for progress and messages."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def say(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    def print(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


@contextmanager
def quiet(log: Path | None, verbose: bool = False) -> Iterator[Console]:
    """Inside: library output goes to ``log``; the yielded console writes to the terminal."""
    if verbose or log is None:
        yield Console()
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(1), os.dup(2)
    out = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    try:
        yield Console(out, err)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in saved:
            os.close(descriptor)
        out.close()
        err.close()
