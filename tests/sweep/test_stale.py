"""Nightly stale check as tests (``pytest -n auto --stale``): one item per registry entry, failing when the entry
is no longer needed, with the evidence in the failure message and in the run folder's stale.json."""

import json

import pytest


def test_entry_still_needed(stale_entry, sweep_session):
    from exporters.versions import package_versions
    from harness.cache import default_cache_dir
    from harness.cells import Cell
    from harness.models import all_model_classes
    from harness.store import RunStore
    from registry.github import GitHubClient
    from registry.stale import check_entries

    known = all_model_classes()
    rerun_store = RunStore(sweep_session.store.directory / "stale-run")

    def rerun(entries):
        results = {}
        for entry in entries:
            cells = [Cell(known[entry.model], backend, shape) for backend, shape in
                     sweep_session.registry.cells_of(entry, shapes=("static", "dynamic"))]  # fmt: skip
            results[entry.label()] = [sweep_session.run(cell, store=rerun_store, registry=None) for cell in cells]
        return results

    github = GitHubClient(cache_file=default_cache_dir() / "github.json")
    (finding,) = check_entries(sweep_session.registry, [stale_entry], known, package_versions(), github, rerun)
    folder = sweep_session.store.directory / "stale"
    folder.mkdir(exist_ok=True)
    (folder / f"{stale_entry.list}-{stale_entry.model}-{stale_entry.scope}.json").write_text(json.dumps(finding.as_dict()))
    if finding.stale:
        pytest.fail(f"{stale_entry.label()} is stale: {finding.verdict}\n  " + "\n  ".join(finding.evidence), pytrace=False)
