"""Python code of FX graphs generated when used, not at every change: a cost cut of the exports, not a workaround.

torch.fx generates and compiles a ``GraphModule``'s Python code whenever its graph is set or ``recompile()`` is
called, and ExecuTorch's passes and partitioner do so after nearly every step, on graphs that are interpreted, never
called: about a fifth of a dynamic ``to-edge``, and a sixth of a static ``torch.export``, whose passes rebuild the
graph several times (docs/performance.md). While ``graph_code_on_demand()`` is active, every
new ``GraphModule`` is torch's own lazy one (``_LazyGraphModule``, which Inductor uses): it generates its code when it
is first called or its code is read. The programs are the same, byte for byte.

torch made its lazy module opt-in (pytorch/pytorch#117911) and uses it through ``_make_graph_module``, which
ExecuTorch does not call (torch's own ``split_module`` moved to it in pytorch/pytorch#177907): ExecuTorch building its
graph modules that way, under ``_use_lazy_graph_module(True)``, would make this module unneeded.

Nor does ``str()`` of a module whose code is not generated yet generate it. ExecuTorch formats the whole module
into a debug message after each partition it cuts out, with an f-string that is built even with debug logging off;
pytorch/executorch#5046 moved an expensive print of a graph module in the same lowering to ``logging.debug`` so
that it would not be built by default. Building that message lazily upstream (``logging.debug("%s", module)``)
would make this unneeded.

torch's lazy module sets the input and output specs (``_in_spec``, ``_out_spec``) only when it generates its code
(torch.export's tracer says so where it reads them): a step that read them from a module it had just built would find
none or stale ones. Here reading them generates the code first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule


def _spec_read_after_code(name: str) -> property:
    def get(module):
        module.real_recompile()
        try:
            return module.__dict__[name]
        except KeyError:  # a graph without pytree code has none, as with an eager GraphModule
            raise AttributeError(name) from None

    def set_(module, value):
        module.__dict__[name] = value

    return property(get, set_)


class _CodeOnDemand(_LazyGraphModule):
    _in_spec = _spec_read_after_code("_in_spec")
    _out_spec = _spec_read_after_code("_out_spec")

    def __str__(self) -> str:
        # ExecuTorch formats the whole module into a debug message (an f-string, built with logging off) after each
        # partition it cuts out: generating the code for it was a fifth of a many-partition lowering
        if self._needs_recompile():
            return f"{torch.nn.Module.__str__(self)}\n# code not generated yet: read .code or call print_readable()"
        return super().__str__()


def _is_plain_graph_module(cls: type) -> bool:
    """``GraphModule`` itself, or the per-instance class it makes for each module (``GraphModuleImpl``), not a
    subclass with its own behaviour."""
    base = next(t for t in cls.__mro__ if t.__qualname__.rsplit(".", 1)[-1] != "GraphModuleImpl")
    return base is GraphModule


@contextlib.contextmanager
def graph_code_on_demand() -> Iterator[None]:
    """While active, a new plain ``GraphModule`` generates its Python code when it is first called or read."""
    original = GraphModule.__dict__["__new__"]

    def __new__(cls, *args, **kwargs):
        return original.__func__(_CodeOnDemand if _is_plain_graph_module(cls) else cls, *args, **kwargs)

    GraphModule.__new__ = staticmethod(__new__)
    try:
        yield
    finally:
        GraphModule.__new__ = original
