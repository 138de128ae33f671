#!/usr/bin/env bash
# Water by cluster shape at a fixed total of compute threads: the MGS cluster-size
# experiment of issue 10 point 7 (paper 002 §5.5), for a machine with many cores.
#
# For THREADS compute threads (default 16) it runs Water (default 4096 molecules ×
# 3 steps) as `--sequential`, as `--threads THREADS` (plain threads, no DSM) and on
# every DSM shape C×T with C·T = THREADS (1×16, 2×8, 4×4, 8×2, 16×1), each shape
# with several clusters both over `shm` (shared memory between the cluster processes)
# and over `udp` (INIs, UDP loopback). Rounds are interleaved: round r runs every
# configuration once, so a change of the machine's speed between rounds hits all alike.
# Each run's energies must equal the sequential run's, as printed (5 decimals).
#
# Usage: scripts/cluster-size-scaling.sh [RESULTS_DIR]
# Environment: BIN (default target/release/multigrain), BASELINE_BIN (optional: a second
# build, run on every DSM shape right after BIN in the same round, labelled
# "SHAPE base"), THREADS (16), MOLECULES (4096),
# STEPS (3), REPEAT (3), RUN_TIMEOUT_S (per run, 120), BUDGET_S (no new round starts
# after this many seconds, 420).
# Output: RESULTS_DIR/runs.csv (config,round,run_s,ok) and a table on stdout: run
# time median (min–max), speedup against --sequential of the same round, and that
# speedup over the speedup of --threads THREADS (the issue's yardstick).
set -u
case "${1:-}" in
    -h | --help)
        sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "error: unknown option $1 (the only argument is the results directory; see --help)" >&2
        exit 2
        ;;
esac
BIN=${BIN:-target/release/multigrain}
THREADS=${THREADS:-16}
MOLECULES=${MOLECULES:-4096}
STEPS=${STEPS:-3}
REPEAT=${REPEAT:-3}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-120}
BUDGET_S=${BUDGET_S:-420}
DIR=${1:-cluster-size-scaling-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$DIR/configs" "$DIR/logs" || exit 1
[ -x "$BIN" ] || { echo "error: $BIN is not an executable (build with cargo build --release, or set BIN)" >&2; exit 1; }

echo "machine: $(nproc) CPUs, kernel $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "problem: Water $MOLECULES molecules × $STEPS steps, $THREADS compute threads, $REPEAT rounds"

configs="seq threads"
for c in $(seq 1 "$THREADS"); do
    [ $((THREADS % c)) -eq 0 ] || continue
    t=$((THREADS / c))
    subs="shm udp"
    [ "$c" -eq 1 ] && subs="shm"   # one cluster: no traffic between clusters
    for s in $subs; do
        name="${c}x${t}-$s"
        [ "$c" -eq 1 ] && name="${c}x${t}"
        cat >"$DIR/configs/$name.toml" <<EOF
[job]
name = "$name"
[local]
clusters = $c
threads = $t
[ini]
substrate = "$s"
mtu = 8972
EOF
        configs="$configs $name"
        [ -n "${BASELINE_BIN:-}" ] && configs="$configs $name+base"
    done
done

args_of() {
    case "${1% base}" in
        seq) echo "--sequential" ;;
        threads) echo "--threads $THREADS" ;;
        *) echo "--config $DIR/configs/${1% base}.toml" ;;
    esac
}

energies() { sed -n '/^energies every/,/^run time/p' "$1" | grep -E '^ +[0-9]' ; }

echo "config,round,run_s,ok" >"$DIR/runs.csv"
start=$(date +%s)
for r in $(seq 1 "$REPEAT"); do
    if [ $(( $(date +%s) - start )) -gt "$BUDGET_S" ]; then
        echo "budget of ${BUDGET_S} s spent: stopping after $((r - 1)) rounds"
        break
    fi
    for entry in $configs; do
        c=${entry/+/ }
        bin=$BIN
        [ "$c" != "$entry" ] && bin=$BASELINE_BIN
        log="$DIR/logs/$entry-r$r.log"
        json="$DIR/logs/$entry-r$r.json"
        # shellcheck disable=SC2046
        timeout -k 5 "$RUN_TIMEOUT_S" "$bin" -q run water --molecules "$MOLECULES" --steps "$STEPS" \
            $(args_of "$c") --json "$json" >"$log" 2>&1
        rc=$?
        run_s=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_s"])' "$json" 2>/dev/null || echo nan)
        ok=yes
        if [ $rc -ne 0 ]; then
            ok="exit-$rc"
            echo "FAILED: $c round $r (exit $rc); the end of its output:"
            tail -n 8 "$log"
        elif [ -z "$(energies "$log")" ]; then
            ok=no-energies
            echo "FAILED: $c round $r printed no energies"
        elif [ "$c" != seq ] && ! diff -q <(energies "$DIR/logs/seq-r$r.log") <(energies "$log") >/dev/null; then
            ok=energies-differ
            echo "FAILED: $c round $r: energies differ from --sequential"
        fi
        echo "$c,$r,$run_s,$ok" >>"$DIR/runs.csv"
        printf '  round %d %-10s %8s s %s\n' "$r" "$c" "$run_s" "$ok"
    done
done

python3 - "$DIR/runs.csv" "$THREADS" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
rows = list(csv.DictReader(open(sys.argv[1])))
threads = sys.argv[2]
t = defaultdict(dict)
for r in rows:
    if r["ok"] == "yes" and r["run_s"] != "nan":
        t[r["config"]][r["round"]] = float(r["run_s"])
def med(xs):
    return "%.3f (%.3f–%.3f)" % (statistics.median(xs), min(xs), max(xs)) if xs else "—"
seq = t.get("seq", {})
thr = t.get("threads", {})
order = list(dict.fromkeys(r["config"] for r in rows))
print()
print("| configuration | run time s, median (min–max) | speedup vs --sequential | speedup / speedup of --threads %s | failed runs |" % threads)
print("|---|---|---|---|---|")
for c in order:
    times = list(t[c].values())
    sp = [seq[k] / v for k, v in t[c].items() if k in seq]
    rel = [(seq[k] / v) / (seq[k] / thr[k]) for k, v in t[c].items() if k in seq and k in thr]
    failed = sum(1 for r in rows if r["config"] == c and r["ok"] != "yes")
    label = {"seq": "--sequential", "threads": "--threads " + threads}.get(c, c)
    print("| %s | %s | %s | %s | %d |" % (label, med(times), med(sp), med(rel), failed))
EOF
