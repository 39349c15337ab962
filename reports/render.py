"""Write a run's static dashboard: HTML pages (no server, no network), ``summary.md`` and ``junit.xml``."""

from __future__ import annotations

import shutil
from pathlib import Path
from xml.sax.saxutils import quoteattr

from jinja2 import Environment, FileSystemLoader, select_autoescape

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
    environment.globals.update(category=data.category, labels=data.CATEGORY_LABELS)
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


def write_report(run_dir, baseline=None, history=None, out=None, stale=None) -> Path:
    """Render the dashboard of ``run_dir`` into ``out`` (default ``run_dir/site``); returns the site folder."""
    view = data.RunView.load(run_dir)
    if not view.metadata and not view.records:
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json, no cells/)")
    base = data.RunView.load(baseline) if baseline else None
    site = Path(out) if out else Path(run_dir) / "site"
    (site / "cells").mkdir(parents=True, exist_ok=True)
    shutil.copytree(HERE / "static", site / "static", dirs_exist_ok=True)

    environment = _environment()
    stale_data = data.load_stale(view, Path(stale) if stale else None)
    context = {
        "run": view,
        "columns": view.columns,
        "tiles": data.tiles(view),
        "funnel": data.funnel(view),
        "changes": data.changes(view, base),
        "baseline": base,
        "duration": view.duration(),
    }
    buckets = data.buckets(view)
    pages = {
        "index.html": ("overview.html", {"stale": stale_data, "buckets": buckets[:10]}),
        "matrix.html": ("matrix.html", {"rows": view.classes, "stages": sorted({r.stage for r in view.records if r.stage})}),
        "failures.html": ("failures.html", {"buckets": buckets}),
        "parity.html": ("parity.html", {"parity": data.parity(view)}),
        "registry.html": ("registry.html", {"rows": data.registry_rows(view, stale_data), "stale": stale_data}),
        "history.html": ("history.html", {"history": data.history(Path(history) if history else None, view)}),
    }
    for filename, (template, extra) in pages.items():
        page = environment.get_template(template).render(page=filename, root="", **context, **extra)
        (site / filename).write_text(page)
    cell_template = environment.get_template("cell.html")
    for record in view.records:
        page = cell_template.render(page="cell", root="../", run=view, record=record)
        (site / "cells" / f"{record.cell_id}.html").write_text(page)
    (site / "summary.md").write_text(summary_markdown(view, context["tiles"], context["changes"], buckets, stale_data))
    (site / "junit.xml").write_text(junit_xml(view))
    return site


def summary_markdown(view, tiles, changes, buckets, stale) -> str:
    versions = view.metadata.get("versions", {})
    lines = [
        "# export-sweep",
        "",
        f"{len(view.records)} cells, {len({r.model_class for r in view.records})} classes; "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        + (f"; {_seconds(view.duration())}" if view.duration() else ""),
        "",
        "| backend | shapes | parity passes | % |",
        "|---|---|---|---|",
    ]
    lines += [f"| {t['backend']} | {t['shape']} | {t['passed']} / {t['total']} | {t['percent']:.1f} |" for t in tiles]
    lines += ["", f"## Regressions ({len(changes['regressions'])})", ""]
    lines += [f"- `{row['cell']}`: {row['before']} -> {row['now']}" for row in changes["regressions"][:50]] or ["none"]
    lines += ["", f"## New passes ({len(changes['new_passes'])})", ""]
    lines += [f"- `{row['cell']}`" for row in changes["new_passes"][:50]] or ["none"]
    lines += ["", "## Largest failure buckets", ""]
    lines += [f"{i}. {b['count']} cells, `{b['signature'][:160]}`" for i, b in enumerate(buckets[:10], 1)] or ["none"]
    stale_entries = [e for e in (stale or {}).get("entries", []) if e.get("stale")]
    lines += ["", f"## Stale registry entries ({len(stale_entries)})", ""]
    lines += [f"- {e['list']} `{e['model']}` [{e['scope']}]: {e['verdict']}" for e in stale_entries] or [
        "none" if stale else "no stale check in this run"
    ]
    return "\n".join(lines) + "\n"


def junit_xml(view) -> str:
    failures = sum(r.status in ("fail", "crash", "timeout", "oom") for r in view.records)
    skipped = sum(r.status in ("skip", "unavailable") for r in view.records)
    total_time = sum(r.seconds or 0 for r in view.records)
    lines = [
        '<?xml version="1.0" encoding="utf-8"?>',
        f'<testsuite name="export-sweep" tests="{len(view.records)}" failures="{failures}" skipped="{skipped}" '
        f'time="{total_time:.1f}">',
    ]
    for record in view.records:
        head = (
            f"<testcase classname={_attribute(record.model_class)} "
            f"name={_attribute(f'{record.backend}-{record.shape_mode}')} time=\"{record.seconds or 0:.2f}\""
        )
        if record.status == "pass":
            lines.append(head + "/>")
            continue
        message = _attribute(f"{record.status} at {record.stage}: {(record.message or '').strip()[:500]}")
        kind = "skipped" if record.status in ("skip", "unavailable") else "failure"
        body = _xml_text(_clip(record.traceback or record.message or "", 20_000)) if kind == "failure" else ""
        error_type = _attribute(record.error_type or record.status)
        lines.append(f"{head}><{kind} message={message} type={error_type}>{body}</{kind}></testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _xml_safe(text: str) -> str:
    """Without the characters XML 1.0 cannot hold at all (NUL, most control characters)."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20 and ord(ch) not in (0xFFFE, 0xFFFF))


def _xml_text(text: str) -> str:
    from xml.sax.saxutils import escape

    return escape(_xml_safe(text))


def _attribute(text: str) -> str:
    return quoteattr(_xml_safe(text))
