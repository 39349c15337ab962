"""Warm, isolated workers: the parent imports torch, transformers and the backends once, and builds what a backend
would otherwise build in every child (on one thread: see ``warm_up_xnnpack``); each model class gets a forked
child that builds the model once and runs that class' cells one after another.

A child that crashes (segfault, abort), runs past the cell timeout or grows past the memory cap is killed by the
parent, which records the cell as ``crash``, ``timeout`` or ``oom`` at the stage it was in (inside an export, the
exporter's own stage, with the stages that ended before it) and goes on with a fresh child for the class' next
cell. A failure in a shared stage (config, build, eager) is not retried: every remaining cell of that class gets
the same record.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path

from .cells import Cell, ClassContext, new_record, run_cell
from .models import ModelClass
from .records import SHARED_STAGES, CellRecord, StageRecord
from .store import CELL_LOG_MARKER


@dataclass
class WorkerOptions:
    timeout: float = 600.0  # seconds per cell, shared stages included for the first cell of a class
    memory_cap_mb: float | None = None  # resident memory not shared with the parent; None: no cap
    threads: int = 1  # torch and ONNX Runtime intra-op threads per child
    log_dir: Path | None = None  # where children's stdout/stderr go (one file per class)
    poll_interval: float = 0.2
    disabled_workarounds: tuple[str, ...] = ()  # run without these (what a workaround protects shows as failures)


def warm_imports(backends) -> None:
    """Import what every child needs, once, in the parent, and build what every child's lowering would."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import exporters.dynamo  # noqa: F401

    from . import inputs, tiny  # noqa: F401  (children must not read harness code that changed mid-run)

    if "onnx" in backends:
        import onnx_ir  # noqa: F401
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401

        from exporters.onnx.exporter import warm_up_onnx

        warm_up_onnx()
    if "executorch" in backends:
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
        from executorch.backends.xnnpack.partition import xnnpack_partitioner  # noqa: F401

        from exporters.executorch.backends import warm_up_xnnpack

        warm_up_xnnpack()
    from exporters.workarounds import import_patch_targets

    import_patch_targets()  # of the exporters imported above
    # Whatever is loaded by now lives as long as the process: out of the collector's sight, a full collection no
    # longer walks torch's, transformers' and ExecuTorch's half-million objects (a quarter of a second each time,
    # about a tenth of a static Dynamo export), and children forked from here do not copy their pages by touching them.
    gc.collect()
    gc.freeze()


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies (a sweep killed with -9 must not leave a child
    exporting to the end of its cell, or forever if it hangs). Linux only; elsewhere the pipe's end tells it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os._exit(1)


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
    meaning = {"SIGSEGV": "segmentation fault", "SIGABRT": "abort", "SIGKILL": "killed", "SIGBUS": "bus error"}
    return f"{name} ({meaning[name]})" if name in meaning else name


# Reading a child's private memory walks its pages: 21 ms for a 600 MB worker, which at every 0.2 s poll of two
# workers took a fifth of a core from the cells. Its whole resident set costs 0.02 ms and bounds it from above.
PRIVATE_MEMORY_EVERY = 2.0  # seconds between reads of a running child's private memory (its peak)
STACKS_SIGNAL = signal.SIGUSR1  # asks a worker to write its Python stacks to its log (faulthandler)
STACKS_WAIT = 0.2  # seconds given to that before the kill
_C_STDIO = ctypes.CDLL(None)


def _resident_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _own_memory_mb(pid: int) -> float | None:
    """Resident memory the child does not share with its parent.

    A forked child starts out sharing every page of the parent (a pytest worker that already ran the exporter tests
    holds gigabytes): VmRSS would count those pages against the cell's cap, private pages do not.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            fields = dict(line.split(":", 1) for line in rollup if line.startswith("Private_"))
        return sum(int(value.split()[0]) for value in fields.values()) / 1024
    except (OSError, ValueError):
        return _resident_mb(pid)


class ClassWorker:
    """The child process of one model class, and the parent's view of it."""

    def __init__(self, model_class: ModelClass, options: WorkerOptions, registry=None, name: str = "worker"):
        self.model_class = model_class
        self.options = options
        self.registry = registry
        self.name = name
        self.pid: int | None = None
        self.connection: Connection | None = None
        self.cell: Cell | None = None
        self.stage = ""
        self.started = 0.0
        self.peak_rss_mb = 0.0
        self.memory_read_at = 0.0  # when the child's private memory was last read: see PRIVATE_MEMORY_EVERY
        self.stage_started = 0.0
        self.shared_stages: list[StageRecord] = []
        self.cell_stages: list[StageRecord] = []  # this cell's own stages that ended so far
        self.shared_failure: CellRecord | None = None  # a crash in a shared stage: the answer for every cell

    # ── parent side ──
    @property
    def busy(self) -> bool:
        return self.cell is not None

    def submit(self, cell: Cell) -> CellRecord | None:
        """Start ``cell``; returns a record at once when the class already failed in a shared stage."""
        if self.shared_failure is not None:
            return self._repeat_shared_failure(cell)
        if self.pid is None:
            self._start()
        shared_done = len(self.shared_stages) == len(SHARED_STAGES)
        self.cell, self.stage, self.started = cell, "export" if shared_done else "config", time.monotonic()
        self.stage_started, self.cell_stages = self.started, []
        self.connection.send(("cell", cell.backend, cell.shape_mode, cell.dtype))
        return None

    def poll(self) -> CellRecord | None:
        """Handle what the child said, and enforce the timeout and memory cap: the finished record, or None."""
        if self.cell is None:
            return None
        try:
            record = self._read_messages()
        except (EOFError, OSError):
            return self._died()
        if record is not None:
            return record
        elapsed = time.monotonic() - self.started
        if elapsed > self.options.timeout:
            return self._kill("timeout", f"ran past the {self.options.timeout:g} s cell timeout in stage {self.stage}")
        used = self._own_memory_due()
        if used is not None:
            self.peak_rss_mb = max(self.peak_rss_mb, used)
            cap = self.options.memory_cap_mb
            if cap and used > cap:
                return self._kill("oom", f"used {used:.0f} MB, over the {cap:g} MB memory cap, in stage {self.stage}")
        if not self._alive():
            try:  # what it said just before it died is still in the pipe: the stage it died in, or even its record
                record = self._read_messages()
            except (EOFError, OSError):
                pass
            return record or self._died()
        return None

    def _own_memory_due(self) -> float | None:
        """The child's private memory when a read is due: every ``PRIVATE_MEMORY_EVERY`` seconds, and at once when its
        whole resident set is over the cap; None in between."""
        cap, now = self.options.memory_cap_mb, time.monotonic()
        over_cap = bool(cap) and (_resident_mb(self.pid) or 0.0) > cap
        if not over_cap and now - self.memory_read_at < PRIVATE_MEMORY_EVERY:
            return None
        self.memory_read_at = now
        return _own_memory_mb(self.pid)

    def _read_messages(self) -> CellRecord | None:
        while self.connection.poll():
            kind, payload = self.connection.recv()
            if kind == "stage":  # (stage starting, shared stages done so far, this cell's stages done so far)
                if payload[0] != self.stage:
                    self.stage, self.stage_started = payload[0], time.monotonic()
                self.shared_stages = [StageRecord(**stage) for stage in payload[1]]
                self.cell_stages = [StageRecord(**stage) for stage in payload[2]]
            elif kind == "record":
                record = CellRecord.from_dict(payload)
                self.peak_rss_mb = max(self.peak_rss_mb, _own_memory_mb(self.pid) or 0.0)
                record.worker, record.peak_rss_mb = self.name, round(self.peak_rss_mb, 1) or None
                self.cell = None
                return record
        return None

    def run(self, cell: Cell) -> CellRecord:
        """Run one cell to its end (for pytest: one item, one cell)."""
        record = self.submit(cell)
        while record is None:
            wait([self.connection], timeout=self.options.poll_interval)
            record = self.poll()
        return record

    def close(self) -> None:
        if self.pid is None:
            return
        try:
            self.connection.send(("exit", None, None))
        except (BrokenPipeError, OSError):
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self._alive():
            time.sleep(0.02)
        self._reap(force=True)

    def _alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True
        self._exit_status = status
        return False

    def _reap(self, force: bool) -> int | None:
        status = getattr(self, "_exit_status", None)
        if self.pid is not None and status is None:
            if force:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                _pid, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                status = None
        if self.connection is not None:
            self.connection.close()
        self.pid, self.connection, self._exit_status = None, None, None
        return status

    def _kill(self, status: str, message: str) -> CellRecord:
        if self.options.log_dir is not None and self.pid is not None:  # where it stood: its stacks, in its log
            try:
                os.kill(self.pid, STACKS_SIGNAL)
                time.sleep(STACKS_WAIT)
            except ProcessLookupError:
                pass
        self._reap(force=True)
        return self._failure(status, message)

    def _died(self) -> CellRecord:
        exit_status = self._reap(force=False)
        if exit_status is None:
            message = f"the worker process vanished in stage {self.stage}"
        elif os.WIFSIGNALED(exit_status):
            message = f"the worker process died of {_signal_name(os.WTERMSIG(exit_status))} in stage {self.stage}"
        else:
            message = f"the worker process exited with code {os.WEXITSTATUS(exit_status)} in stage {self.stage}"
        return self._failure("crash", message)

    def _failure(self, status: str, message: str) -> CellRecord:
        cell, self.cell = self.cell, None
        record = new_record(cell)
        record.stages = [*self.shared_stages, *self.cell_stages]  # the ones that ended before this stage began
        record.stages.append(
            StageRecord(
                self.stage, status, round(time.monotonic() - self.stage_started, 2), status.capitalize(), message
            )
        )
        record.worker, record.peak_rss_mb = self.name, round(self.peak_rss_mb, 1) or None
        record.finished_at = record.started_at
        record.finish()
        if self.stage in SHARED_STAGES:
            self.shared_failure = record
        return record

    def _repeat_shared_failure(self, cell: Cell) -> CellRecord:
        record = new_record(cell)
        record.stages = [StageRecord(**vars(stage)) for stage in self.shared_failure.stages]
        failed = record.stages[-1]
        failed.message = f"{failed.message} (a shared stage: not retried for this cell)"
        record.worker, record.finished_at = self.name, record.started_at
        return record.finish()

    def _start(self) -> None:
        parent_end, child_end = Pipe(duplex=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.parent_pid = os.getpid()
        pid = os.fork()
        if pid == 0:  # child
            code = 0
            try:
                parent_end.close()
                self._child_main(child_end)
            except BaseException:  # the parent sees the exit code; the log keeps the story
                traceback.print_exc()
                code = 70
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        child_end.close()
        self.pid, self.connection, self._exit_status = pid, parent_end, None

    # ── child side ──
    def _child_main(self, connection: Connection) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's handler raises into code it does not own
        die_with_parent(self.parent_pid)
        if self.options.log_dir is not None:
            self.options.log_dir.mkdir(parents=True, exist_ok=True)
            log = os.open(self.options.log_dir / f"{self.model_class.name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            # Python's own streams too: under pytest or a notebook they are not the process' descriptors
            sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        faulthandler.enable(file=2, all_threads=True)  # a crash's last words: the Python stack it died in, in the log
        faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)  # asked for by the parent before a kill
        import torch

        torch.set_num_threads(self.options.threads)
        context = ClassContext(self.model_class)
        names = self.options.disabled_workarounds
        if not names:  # the usual case: no other backend's workarounds loaded into this child
            self._serve(connection, context)
            return
        from exporters.workarounds import disabled_workarounds

        with disabled_workarounds(*names):
            self._serve(connection, context)

    def _serve(self, connection: Connection, context: ClassContext) -> None:
        def on_stage(name: str, ended=()) -> None:
            shared, own = [vars(stage) for stage in context.stages], [vars(stage) for stage in ended]
            connection.send(("stage", (name, shared, own)))

        while True:
            kind, *cell = connection.recv()
            if kind == "exit":
                return
            cell = Cell(self.model_class, *cell)
            if self.options.log_dir is not None:  # where this cell's part of the class log starts
                sys.stdout.flush()
                sys.stderr.flush()
                _C_STDIO.fflush(None)  # native code's buffered output belongs to the cell before
                os.write(2, f"\n{CELL_LOG_MARKER}{cell.id}\n".encode())
            record = run_cell(cell, context, self.registry, on_stage)
            connection.send(("record", record.to_dict()))
