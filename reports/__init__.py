"""The dashboard: a static site of a run (overview, matrix, failure buckets, parity, registry, history, one page
per cell), plus ``summary.md`` and ``junit.xml``. Reads cell records only."""

from .render import write_report

__all__ = ["write_report"]
