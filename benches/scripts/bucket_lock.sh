#!/usr/bin/env bash
# The token bucket's lock, spin's yielding `SpinMutex` (the bucket's) beside parking_lot's `Mutex`,
# in one sitting: `benches/scripts/bucket_lock.sh [ROUNDS]` (default 6). Builds the `bucket_lock`
# bench twice, the second time with RUSTFLAGS='--cfg admission_bucket_lock="parking_lot"' in a
# target directory of its own ($CARGO_TARGET_DIR/bucket-lock-parking-lot, so neither build evicts
# the other); then runs the two binaries in turn, the order swapped every round, printing every
# line they print; then each lock's median wall time, CPU time and context switches per shape, and
# spin's ratios to parking_lot. See benches/benches/bucket_lock.rs for what one run measures, and
# admission-accounts/src/token_bucket/cells.rs for the run that chose the lock.
set -euo pipefail
rounds=${1:-6}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The path of the bench binary cargo builds with the environment given.
build() {
    env "$@" cargo bench --manifest-path "$root/Cargo.toml" -p admission-benches \
        --bench bucket_lock --no-run --message-format=json-render-diagnostics |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "bucket_lock" and m.get("executable"):
        print(m["executable"])'
}

spin=$(build CARGO_TARGET_DIR="$target")
parking_lot=$(build CARGO_TARGET_DIR="$target/bucket-lock-parking-lot" \
    RUSTFLAGS="${RUSTFLAGS:-} --cfg admission_bucket_lock=\"parking_lot\"")
echo "parking_lot: $parking_lot"
echo "spin:        $spin"
echo "load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs"

for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then order=("$parking_lot" "$spin"); else order=("$spin" "$parking_lot"); fi
    for binary in "${order[@]}"; do
        "$binary" | sed "s/^/round $round: /" | tee -a "$log"
    done
done

python3 - "$log" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    key = (fields["lock"], fields["shape"])
    runs.setdefault(key, []).append(fields)
def median(lock, shape, field):
    return statistics.median(float(run[field]) for run in runs[(lock, shape)])
print()
print("medians over %d rounds" % len(runs[("parking_lot", "1_thread")]))
print("%-11s %-12s %10s %10s %10s" % ("shape", "lock", "wall ms", "cpu ms", "switches"))
for shape in ("1_thread", "4_threads", "16_threads"):
    for lock in ("parking_lot", "spin"):
        print("%-11s %-12s %10.1f %10.1f %10.0f" % (shape, lock,
            median(lock, shape, "wall_ms"), median(lock, shape, "cpu_ms"),
            median(lock, shape, "switches")))
wins = []
for shape in ("1_thread", "4_threads", "16_threads"):
    wall = median("spin", shape, "wall_ms") / median("parking_lot", shape, "wall_ms")
    cpu = median("spin", shape, "cpu_ms") / median("parking_lot", shape, "cpu_ms")
    print("%s: spin / parking_lot: wall %.2fx, cpu %.2fx" % (shape, wall, cpu))
    wins.append(wall < 1 and cpu < 1)
print("spin wins wall and CPU time in every shape: %s" % ("yes" if all(wins) else "no"))
EOF
