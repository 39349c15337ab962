"""One test per sweep cell: passes when the exported artifact matches eager; the record says how far it got."""

import sys

import pytest


def test_cell(sweep_cell, sweep_session):
    record = sweep_session.run(sweep_cell)
    summary = f"{record.status} at {record.stage}: {(record.message or '').strip().splitlines()[0][:300] if record.message else ''}"
    if record.status in ("skip", "unavailable"):
        pytest.skip(summary)
    if record.status != "pass":
        log = sweep_session.store.cell_log(record)
        if log:  # the worker's own words: pytest shows them under the failure, and its JUnit file keeps them
            print(log, file=sys.stderr)
        pytest.fail(f"{summary}\nrepro: {record.repro}", pytrace=False)
