"""Write a run's static dashboard: HTML pages (no server, no network), ``summary.md`` and ``junit.xml``."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from xml.sax.saxutils import quoteattr

from jinja2 import Environment, FileSystemLoader, select_autoescape

from harness.models import GENERATIVE_TASKS
from harness.store import RunStore

from . import data

HERE = Path(__file__).resolve().parent
TRACEBACK_LIMIT = 200_000  # characters of a traceback shown on a page; the record keeps it whole


def _environment() -> Environment:
    environment = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["seconds"] = _seconds
    environment.filters["sci"] = lambda value: "" if value is None else f"{value:.2g}"
    environment.filters["clip"] = lambda text, limit=TRACEBACK_LIMIT: _clip(text, limit)
    environment.filters["first_line"] = lambda text: (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""
    environment.filters["safe_url"] = _safe_url
    environment.filters["pass_rate"] = lambda tally: data.percent(*tally)  # as the tiles and summary.md round it
    environment.globals.update(category=data.category, labels=data.CATEGORY_LABELS, modality=data.modality)
    return environment


def _seconds(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    if value < 60:
        return f"{value:.1f} s"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _clip(text: str | None, limit: int) -> str:
    if not text:
        return ""
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n\n... {len(text) - limit} characters cut ...\n\n" + text[-limit // 2 :]


def write_report(run_dir, baseline=None, history=None, out=None, stale=None, workarounds=None) -> Path:
    """Render the dashboard of ``run_dir`` into ``out`` (default ``run_dir/site``); returns the site folder.

    ``workarounds`` is the workaround listing to show (default: the one the run kept). A record that cannot be read
    does not stop the rest: it is left out and named on the overview."""
    view = data.RunView.load(run_dir)
    if not view.metadata and not view.records and not view.corrupt:
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json, no cells/)")
    base = data.RunView.load(baseline) if baseline else None
    site = Path(out) if out else Path(run_dir) / "site"
    (site / "cells").mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE / "static", site / "static", dirs_exist_ok=True)

    environment = _environment()
    stale_data = data.load_stale(view, Path(stale) if stale else None)
    trend = data.history(Path(history) if history else None, view)
    context = {
        "run": view,
        "columns": view.columns,
        "tiles": data.tiles(view, base),
        "funnel": data.funnel(view),
        "changes": data.changes(view, base),
        "baseline": base,
        "duration": view.duration(),
        "cost": data.cost(view),
        "versions": _versions(view, base),
    }
    buckets = data.buckets(view)
    ledger = data.workaround_ledger(view, workarounds, stale_data)
    pages = {
        "index.html": ("overview.html", {"stale": stale_data, "buckets": buckets[:10], "breakdown": data.breakdown(view)}),
        "matrix.html": ("matrix.html", {"rows": view.classes, "stages": sorted({r.stage for r in view.records if r.stage})}),
        "changes.html": ("changes.html", {"change_labels": data.CHANGE_LABELS}),
        "failures.html": ("failures.html", {"buckets": buckets}),
        "parity.html": ("parity.html", {"parity": data.parity(view)}),
        "registry.html": ("registry.html", {"rows": data.registry_rows(view, stale_data), "stale": stale_data}),
        "history.html": ("history.html", {"history": trend}),
        "workarounds.html": ("workarounds.html", {"ledger": ledger}),
    }
    for filename, (template, extra) in pages.items():
        page = environment.get_template(template).render(page=filename, root="", **context, **extra)
        _write(site / filename, page)
    cell_template = environment.get_template("cell.html")
    store = RunStore(run_dir)  # what a failure's worker said, read once for its page and junit.xml
    logs = {r.cell_id: store.cell_log(r) for r in view.records if r.status not in ("pass", "skip")}
    for record in view.records:
        page = cell_template.render(page="cell", root="../", run=view, record=record, versions=context["versions"],
                                    owner=ledger["owner"], log=logs.get(record.cell_id))  # fmt: skip
        _write(site / "cells" / f"{record.cell_id}.html", page)
    _write(site / "summary.md", summary_markdown(view, context["tiles"], context["changes"], buckets, stale_data,
                                                       context["cost"]))
    _write(site / "junit.xml", junit_xml(view, context["changes"], logs))
    _write(site / data.NIGHTS_FILE, json.dumps({"nights": trend["nights"]}, indent=0))
    if base is not None:  # what the nightly's issue and exit code are made of, for tools
        kinds = context["changes"]["kinds"]
        _write(site / "changes.json", json.dumps({
            "baseline": str(base.directory), "baseline_started_at": base.metadata.get("started_at"),
            "counts": context["changes"]["counts"],
            "cells": {kind: [change.as_dict() for change in items] for kind, items in kinds.items() if kind != "unchanged"},
        }, indent=1))  # fmt: skip
    return site


def _write(path: Path, text: str) -> None:
    # a lone surrogate in a message (bytes a model's tokenizer decoded badly) must not stop the dashboard
    path.write_text(text, encoding="utf-8", errors="replace")


def _versions(view, base) -> list[tuple[str, str | None, str | None]]:
    """(package, this run's version, the baseline's when it differs): the header shows both sets of an upgrade."""
    mine = view.metadata.get("versions") or {}
    theirs = (base.metadata.get("versions") or {}) if base is not None else {}
    return [(name, version, theirs.get(name) if theirs.get(name) != version else None)
            for name, version in mine.items() if version]  # fmt: skip


def _safe_url(url) -> str | None:
    """Links from records are shown only when they are web links: a crafted ``javascript:`` URL is text."""
    return url if isinstance(url, str) and re.match(r"^https?://[^\s\"'<>]+$", url) else None


# ── summary.md: Markdown for GitHub's job summary and issues, where text from records must stay text ──


def md_text(text) -> str:
    """Plain text in Markdown: no HTML, no emphasis, links or tables from what a record says."""
    text = html.escape(str(text), quote=False).replace("\n", " ")
    return re.sub(r"([\\`*_\[\]{}|!~#])", r"\\\1", text)


def md_code(text) -> str:
    """A code span that no backtick inside ``text`` can close early."""
    text = str(text).replace("\n", " ").replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or longest else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def summary_markdown(view, tiles, changes, buckets, stale, cost) -> str:
    versions = view.metadata.get("versions", {})
    lines = [
        "# export-sweep",
        "",
        md_text(
            f"{len(view.records)} cells, {len({r.model_class for r in view.records})} classes; "
            + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
            + (f"; {_seconds(view.duration())}" if view.duration() else "")
        ),
        "",
    ]
    base = changes.get("baseline")
    if base is not None:
        counts = changes["counts"]
        lines += [f"## Changes against {md_text(base.label)}", "",
                  ", ".join(f"{kind} {counts[kind]}" for kind in data.CHANGE_LABELS if counts.get(kind)) or "none", ""]  # fmt: skip
        for kind in ("regression", "new-failure", "missing", "stage-moved", "drift", "fixed", "vanished"):
            items = changes["kinds"].get(kind, [])
            if items:
                lines += [f"### {kind} ({len(items)})", ""]
                lines += [f"- {md_code(change.cell_id)}: {md_text(change.detail)}" for change in items[:50]]
                lines += [f"- ... and {len(items) - 50} more"] if len(items) > 50 else []
                lines += [""]
    if view.missing:
        lines += [f"**{len(view.missing)} planned cells have no record** (missing shards: "
                  f"{md_text(view.metadata.get('missing_shards') or 'none')}).", ""]  # fmt: skip
    delta = base is not None
    lines += ["| backend | shapes | parity passes | % |" + (" change |" if delta else ""),
              "|---|---|---|---|" + ("---|" if delta else "")]  # fmt: skip
    for t in tiles:
        row = f"| {t['backend']} | {t['shape']} | {t['passed']} / {t['total']} | {t['percent']:.1f} |"
        if delta:
            row += f" {t['delta']:+.1f} |" if "delta" in t else " |"
        lines.append(row)
    shares = data.dtype_shares(view)
    if shares:
        lines += ["", "## Half precision, against float32", "",
                  "Of the classes that pass a column in float32: how many pass it in the other dtype, and how many "
                  "the backend's runtime cannot run in it.", "",
                  "| backend | shapes | dtype | passes in float32 | pass | unavailable | % | % of what the runtime runs |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in shares:
            runnable = "-" if row["percent_runnable"] is None else f"{row['percent_runnable']:.1f}"
            lines.append(f"| {row['backend']} | {row['shape']} | {row['dtype']} | {row['base']} | {row['passed']} | "
                         f"{row['unavailable']} | {row['percent']:.1f} | {runnable} |")  # fmt: skip
    lines += _generate_by_task_markdown(view)
    lines += _cost_markdown(cost)
    lines += ["", "## Largest failure buckets", ""]
    lines += [f"{i}. {b['count']} cells, {md_code(b['signature'][:160])}" for i, b in enumerate(buckets[:10], 1)] or ["none"]
    stale_entries = [e for e in (stale or {}).get("entries", []) if e.get("stale")]
    lines += ["", f"## Stale registry entries ({len(stale_entries)})", ""]
    lines += [f"- {md_text(e['list'])} {md_code(e['model'])} [{md_text(e['scope'])}]: {md_text(e['verdict'])}"
              for e in stale_entries] or ["none" if stale else "no stale check in this run"]  # fmt: skip
    if view.corrupt:
        lines += ["", f"## Unreadable files ({len(view.corrupt)})", ""]
        lines += [f"- {md_text(problem)}" for problem in view.corrupt[:50]]
    return "\n".join(lines) + "\n"


def _generate_by_task_markdown(view) -> list[str]:
    """The generate columns of the overview's pass rates by task, for the tasks that make a class generate; a class
    counts under each of them it serves."""
    columns = [f"{backend}-{mode}" for backend, mode in view.columns if mode.startswith("generate")]
    by_task = {row["value"]: row for row in data.breakdown(view) if row["group"] == "task"}
    rows = [by_task[task] for task in GENERATIVE_TASKS if task in by_task and any(c in by_task[task]["cells"] for c in columns)]
    if not rows:
        return []
    lines = ["", "## Generate, by task", "",
             "Generate cells on record that give eager greedy's tokens, by the task of their class.", "",
             "| task | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]  # fmt: skip
    for row in rows:
        tallies = (row["cells"].get(column, (0, 0)) for column in columns)
        cells = (f"{passed} / {total} ({data.percent(passed, total):.1f} %)" if total else "-" for passed, total in tallies)
        lines.append(f"| {md_text(row['value'])} | " + " | ".join(cells) + " |")
    return lines


def _cost_markdown(cost: dict) -> list[str]:
    if not cost["rows"]:
        return []
    single = sum(row["hours"] for row in cost["rows"] if row["shape"] in ("static", "dynamic"))
    lines = ["", "## Cost", "",
             f"{cost['hours']:.1f} cell-hours for the cells this run ran; static and dynamic {single:.1f}. "
             + (f"Cells whose worker went above {cost['ceiling_mb']:,} MB: {len(cost['above'])}." if cost["above"]
                else f"No cell's worker went above {cost['ceiling_mb']:,} MB."), "",
             "| backend | shapes | cells run | cell-hours | median cell | largest stages (cell-hours) | largest worker memory |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in cost["rows"]:
        stages = ", ".join(f"{name} {hours:.2f}" for name, hours in row["stages"])
        peak = "-" if row["peak_mb"] is None else f"{row['peak_mb']:,.0f} MB"
        lines.append(f"| {row['backend']} | {row['shape']} | {row['cells']} | {row['hours']:.2f} | "
                     f"{_seconds(row['median_seconds'])} | {stages} | {peak} |")  # fmt: skip
    if cost["above"]:
        lines += ["", *(f"- {md_code(above['cell_id'])}: {above['peak_mb']:,.0f} MB" for above in cost["above"][:20])]
    return lines


JUNIT_CLASS = "tests.sweep.test_sweep"  # as pytest names the sweep's items: one identity everywhere


def junit_xml(view, changes=None, logs=None) -> str:
    """One testcase per cell, named as pytest names it (``test_cell[<cell id>]``). Against a baseline, a cell that
    failed there too is an expected failure (skipped, type pytest.xfail); a planned cell without a record fails.
    A failure carries its part of the worker's log (``logs``, by cell id) as the testcase's standard error."""
    kinds = {change.cell_id: change.kind for items in (changes or {}).get("kinds", {}).values() for change in items}
    cases, failures, skipped = [], 0, 0
    for record in view.records:
        head = f'<testcase classname="{JUNIT_CLASS}" name={_attribute(f"test_cell[{record.cell_id}]")} time="{record.seconds or 0:.2f}"'
        if record.status == "pass":
            cases.append(head + "/>")
            continue
        message = _attribute(f"{record.status} at {record.stage}: {(record.message or '').strip()[:500]}")
        if record.status in ("skip", "unavailable"):
            skipped += 1
            cases.append(f'{head}><skipped type="pytest.skip" message={message}></skipped></testcase>')
        elif kinds.get(record.cell_id) in ("stage-moved", "unchanged"):
            skipped += 1
            reason = _attribute(f"fails in the baseline too: {record.error_signature or record.stage}")
            cases.append(f'{head}><skipped type="pytest.xfail" message={reason}></skipped></testcase>')
        else:
            failures += 1
            body = _xml_text(_clip(record.traceback or record.message or "", 20_000))
            log = (logs or {}).get(record.cell_id)
            err = f"<system-err>{_xml_text(log)}</system-err>" if log else ""
            cases.append(f"{head}><failure message={message} type={_attribute(record.error_type or record.status)}>"
                         f"{body}</failure>{err}</testcase>")  # fmt: skip
    for cell in view.missing:
        failures += 1
        cases.append(f'<testcase classname="{JUNIT_CLASS}" name={_attribute(f"test_cell[{cell}]")} time="0">'
                     '<failure message="missing: planned, never run" type="missing"></failure></testcase>')  # fmt: skip
    total_time = sum(r.seconds or 0 for r in view.records)
    return "\n".join([
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuite name="export-sweep" tests="{len(cases)}" failures="{failures}" skipped="{skipped}" time="{total_time:.1f}">',
        *cases,
        "</testsuite>",
    ]) + "\n"  # fmt: skip


def _xml_safe(text: str) -> str:
    """Without the characters XML 1.0 cannot hold at all (NUL, most control characters)."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20 and ord(ch) not in (0xFFFE, 0xFFFF))


def _xml_text(text: str) -> str:
    from xml.sax.saxutils import escape

    return escape(_xml_safe(text))


def _attribute(text: str) -> str:
    return quoteattr(_xml_safe(text))
