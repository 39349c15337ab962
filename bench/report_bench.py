"""How long the dashboard takes to render a run of N synthetic cells (median of several renders).

    .venv/bin/python bench/report_bench.py --cells 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports import write_report  # noqa: E402
from tests.reports.conftest import synthetic_run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workspace:
        synthetic_run(Path(workspace) / "run", args.cells)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            write_report(Path(workspace) / "run", out=Path(workspace) / "site")
            times.append(time.perf_counter() - start)
    print(f"rendered {args.cells} cells: median {statistics.median(times):.2f} s over {args.repeats} "
          f"(min {min(times):.2f}, max {max(times):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
