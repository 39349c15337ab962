#!/usr/bin/env bash
# The coverage campaign's full sweep: every class x every backend x static,dynamic,generate, in 10 shards run one
# after another at one pinned commit (sweep/SHA), niced, then the seeded 200-class half-precision sample (static,
# float32,bfloat16,float16) at the same commit, its float32 cells taken from the shards. It takes about a day on 2
# cores, longer than a machine is kept, so the records are archived beside this file and committed: a fresh machine
# resumes where they stop.
#
#   bash docs/coverage/full_sweep.sh run     # restore the archives, then run or resume each unfinished part
#   bash docs/coverage/full_sweep.sh save    # archive every shard run so far into docs/coverage/sweep/ (commit it)
#   bash docs/coverage/full_sweep.sh status  # each part's cells done of planned, and the hours left at the pace so far
#   bash docs/coverage/full_sweep.sh report  # all parts done: merge the shards, write the dashboard and summary.md
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
main=$(cd "$here/../.." && pwd)
archives=$here/sweep
sha=$(cat "$archives/SHA")
tree=$(dirname "$main")/sweep_${sha:0:7}
runs=$main/runs/full
shards=10

restore() {
    mkdir -p "$runs"
    for archive in "$archives"/*.tar.gz; do
        [ -e "$archive" ] || continue
        name=$(basename "$archive" .tar.gz)
        # a local folder is the same run with at least as many cells: keep it
        [ -d "$runs/$name" ] || tar -xzf "$archive" -C "$runs"
    done
    [ -d "$tree" ] || git -C "$main" worktree add --detach "$tree" "$sha"
}

finished() {  # the shard's run.json has its end time
    "$main/.venv/bin/python" - "$1/run.json" <<'EOF'
import json, sys
try:
    sys.exit(0 if json.load(open(sys.argv[1])).get("finished_at") else 1)
except FileNotFoundError:
    sys.exit(1)
EOF
}

# a function read whole before it runs: editing this file under a running campaign cannot change what it does next
main() {
case "${1:-}" in
run)
    restore
    for i in $(seq 1 $shards); do
        out=$runs/shard-$i
        finished "$out" && continue
        echo "$(date -u +%FT%TZ) shard $i/$shards"
        (cd "$tree" && nice -n 19 "$main/.venv/bin/python" -m commands run --models all --shard "$i/$shards" \
            --backends dynamo,onnx,executorch --shapes static,dynamic,generate --jobs 2 --no-cache --resume \
            --no-report --out "$out") || echo "shard $i exited $?: its records stay, run again to resume it"
    done
    finished "$runs/half" && exit 0
    echo "$(date -u +%FT%TZ) half precision"
    # the sample's float32 cells are the shards' static cells, at the same commit: copied (a record already there
    # is kept), not run twice
    mkdir -p "$runs/half/cells"
    models=$(cd "$tree" && "$main/.venv/bin/python" -m commands run --models all --sample 200 --seed 1 --list \
        | awk -F '\t' 'NF == 3 {print $1}') || { echo "the sample's classes could not be listed: run again"; exit 1; }
    for model in $models; do
        for backend in dynamo onnx executorch; do
            for cell in "$runs"/shard-*/cells/"$model-$backend-static.json"; do
                if [ -e "$cell" ]; then cp -n "$cell" "$runs/half/cells/"; fi
            done
        done
    done
    echo "half precision: $(ls "$runs/half/cells" | wc -l) cells on record, float32 ones taken from the shards"
    (cd "$tree" && nice -n 19 "$main/.venv/bin/python" -m commands run --models all --sample 200 --seed 1 \
        --backends dynamo,onnx,executorch --shapes static --dtypes float32,bfloat16,float16 --jobs 2 --no-cache \
        --resume --no-report --out "$runs/half") || echo "half precision exited $?: its records stay, run again"
    ;;
save)
    for out in "$runs"/shard-* "$runs/half"; do
        [ -d "$out/cells" ] || continue
        # byte-stable archives: a shard that did not move leaves git nothing to commit
        tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$runs" -cf - "$(basename "$out")" \
            | gzip -n -9 > "$archives/$(basename "$out").tar.gz"
        echo "$(basename "$out"): $(ls "$out/cells" | wc -l) cells"
    done
    ;;
status)
    "$main/.venv/bin/python" - "$runs" "$shards" <<'EOF'
import json, pathlib, sys
runs, shards = pathlib.Path(sys.argv[1]), int(sys.argv[2])
planned = {}  # part -> cells it runs: a shard's from the plan every shard writes, the sample's from its own
for plan_file in runs.glob("*/plan.json"):
    plan = json.loads(plan_file.read_text())
    sample = bool(plan.get("selection", {}).get("sample"))
    counts = {}
    for entry in plan.get("classes", {}).values():
        part = plan_file.parent.name if sample else f"shard-{entry['shard']}"
        counts[part] = counts.get(part, 0) + len(entry["cells"])
    planned.update(counts)
seconds = done = left = 0
for part in [f"shard-{i}" for i in range(1, shards + 1)] + ["half"]:
    cells = []
    for path in (runs / part / "cells").glob("*.json"):
        try:
            cells.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:  # the run itself reports and re-runs such a cell
            print(f"{path}: unreadable, not counted ({error})", file=sys.stderr)
    run = runs / part / "run.json"
    finished = run.exists() and json.loads(run.read_text()).get("finished_at")
    total = planned.get(part)
    seconds += sum(cell.get("seconds") or 0 for cell in cells)
    done += len(cells)
    left += 0 if finished else max((total or 0) - len(cells), 0)
    state = "finished" if finished else ("not started" if not cells else "started")
    print(f"{part:9s} {len(cells):5d} of {total if total is not None else '?':>5} cells  {state}")
if done:
    hours = left * seconds / done / 3600
    print(f"left: {left} cells, about {hours:.1f} cell-hours, {hours / 2:.1f} h on 2 workers, at the pace so far"
          " (a part with no plan yet, '?', is not counted)")
EOF
    ;;
report)
    restore
    for part in $(seq -f "shard-%g" 1 $shards) half; do
        finished "$runs/$part" || { echo "$part is not finished" >&2; exit 1; }
    done
    rm -rf "$runs/merged"
    "$main/.venv/bin/export-sweep" merge "$runs/merged" "$runs"/shard-*
    "$main/.venv/bin/export-sweep" report "$runs/merged"
    "$main/.venv/bin/export-sweep" report "$runs/half"
    # summary.md: the full sweep's, with the half-precision table of the sample run at the same commit
    "$main/.venv/bin/python" - "$runs/merged/site/summary.md" "$runs/half/site/summary.md" "$here/summary.md" <<'EOF'
import re, sys
full, half = (open(path).read() for path in sys.argv[1:3])
table = re.search(r"^## Half precision, against float32\n.*?(?=^## )", half, re.M | re.S)
if table is None:
    sys.exit("the half-precision run's summary has no half-precision table")
section = table.group(0).replace("against float32", "against float32 (the seeded 200-class sample, static)", 1)
at = full.index("## Cost") if "## Cost" in full else full.index("## Largest failure buckets")
open(sys.argv[3], "w").write(full[:at] + section + full[at:])
EOF
    ;;
*)
    sed -n "2,10s/^# \{0,1\}//p" "$0" >&2
    exit 2
    ;;
esac
}

main "$@"
exit
