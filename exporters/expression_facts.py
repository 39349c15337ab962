"""Two facts of a symbolic size remembered, not recomputed at every read: a cost cut of dynamic exports, not a
workaround.

A dynamic export computes with sizes that are sympy expressions (``s0 * s1 + 2``), and torch asks two questions of
them again and again: is it a plain number (``SymNode.expr`` and ``SymNode.maybe_as_int``, for every size of every
fake tensor), and which symbols does it hold (the fake tensor cache's keys, every runtime assert). sympy answers both
by walking the whole expression each time (``Expr.is_number``, ``Basic.free_symbols``): about a fifth of a dynamic
ExecuTorch to-edge on an audio model whose sizes are long expressions (docs/performance.md). Both answers depend on
the expression alone, which sympy never changes, so while ``expression_facts_remembered()`` is active each is
computed once per expression object.

Upstream is removing the repeated questions: pytorch/pytorch#192677 makes ``SymNode.expr`` ask the class attribute
``is_Number`` instead, and pytorch/pytorch#193219 memoizes symbolic arithmetic. Once the pinned torch has them, this
module's share of a profile says whether it still earns its place.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

from sympy.core.basic import Basic
from sympy.core.expr import Expr

_ORIGINAL_IS_NUMBER = Expr.__dict__["is_number"]
_ORIGINAL_FREE_SYMBOLS = Basic.__dict__["free_symbols"]


@contextlib.contextmanager
def expression_facts_remembered() -> Iterator[None]:
    """While active, ``Expr.is_number`` and ``Basic.free_symbols`` walk an expression once; a nested use is the
    outer one. Answers are kept by object identity with the object itself, so no id is reused while kept, and
    dropped on exit."""
    if Expr.__dict__["is_number"] is not _ORIGINAL_IS_NUMBER:
        yield
        return
    numbers: dict[int, tuple[Basic, bool]] = {}
    symbols: dict[int, tuple[Basic, frozenset]] = {}

    def is_number(expression):
        known = numbers.get(id(expression))
        if known is None:
            known = numbers[id(expression)] = (expression, all(arg.is_number for arg in expression.args))
        return known[1]

    def free_symbols(expression):
        known = symbols.get(id(expression))
        if known is None:
            found = frozenset().union(*(arg.free_symbols for arg in expression.args))
            known = symbols[id(expression)] = (expression, found)
        return set(known[1])  # a caller may change the set it gets, as sympy's own is new at every read

    Expr.is_number = property(is_number, doc=_ORIGINAL_IS_NUMBER.__doc__)
    Basic.free_symbols = property(free_symbols, doc=_ORIGINAL_FREE_SYMBOLS.__doc__)
    try:
        yield
    finally:
        Expr.is_number = _ORIGINAL_IS_NUMBER
        Basic.free_symbols = _ORIGINAL_FREE_SYMBOLS


def remembering_expression_facts(export: Callable) -> Callable:
    """An exporter's ``export`` with expression facts remembered throughout (the name is looked up at each call,
    so a benchmark or test can switch the cut off)."""

    @functools.wraps(export)
    def export_remembering(*args, **kwargs):
        with expression_facts_remembered():
            return export(*args, **kwargs)

    return export_remembering
