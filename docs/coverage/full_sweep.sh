#!/usr/bin/env bash
# The coverage campaign's full sweep: every class x every backend x static,dynamic,generate, in 10 shards run one
# after another at one pinned commit (sweep/SHA), niced, then the seeded 200-class half-precision sample (static,
# float32,bfloat16,float16) at the same commit. It takes about a day on 2 cores, longer than a machine is kept, so
# the records are archived beside this file and committed: a fresh machine resumes where they stop.
#
#   bash docs/coverage/full_sweep.sh run     # restore the archives, then run or resume each unfinished part
#   bash docs/coverage/full_sweep.sh save    # archive every shard run so far into docs/coverage/sweep/ (commit it)
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
    sed -n "2,9s/^# \{0,1\}//p" "$0" >&2
    exit 2
    ;;
esac
