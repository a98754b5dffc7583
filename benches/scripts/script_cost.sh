#!/usr/bin/env bash
# The server's own time per call of the cell's library, at two revisions side by side in one
# private redis-server: `benches/scripts/script_cost.sh OLD_REV [NEW_REV]` (NEW_REV: the working
# tree). Each library is loaded under its own name and drives a cell of its own; for three rounds
# it runs 20,000 granting acquires (a fresh lease id each, nothing released: the grant path) and
# 30,000 snapshots with redis-benchmark (one connection), and prints the server's
# `usec_per_call` of FCALL from INFO commandstats. Needs redis-server, redis-cli and
# redis-benchmark on PATH (apt-get install redis-server redis-tools).
set -euo pipefail
old_rev=${1:?usage: script_cost.sh OLD_REV [NEW_REV]}
new_rev=${2:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT

git -C "$root" show "$old_rev:admission-redis/src/lease.lua" | sed 's/__LIBRARY__/oldlib/g' > "$dir/old.lua"
if [ -n "$new_rev" ]; then
    git -C "$root" show "$new_rev:admission-redis/src/lease.lua" | sed 's/__LIBRARY__/newlib/g' > "$dir/new.lua"
else
    sed 's/__LIBRARY__/newlib/g' "$root/admission-redis/src/lease.lua" > "$dir/new.lua"
fi
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/r.pid" --logfile "$dir/r.log"
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
redis-cli -p "$port" -x FUNCTION LOAD < "$dir/old.lua" >/dev/null
redis-cli -p "$port" -x FUNCTION LOAD < "$dir/new.lua" >/dev/null

per_call() {
    redis-cli -p "$port" INFO commandstats | grep cmdstat_fcall | grep -o 'usec_per_call=[0-9.]*' | cut -d= -f2
}
for round in 1 2 3; do
    for lib in oldlib newlib; do
        keys=()
        for k in cfg occ exp events quota line live; do keys+=("c$round:{$lib}:$k"); done
        # init: ceilings far above what the run takes, TTL 60 s, no idle expiry, no recovery.
        redis-cli -p "$port" FCALL "$lib" 7 "${keys[@]}" init fp 1000000000 1000000 1000000000 \
            1000000 1000000 1000 60000 0 0 0 0 60000 0 0 '' >/dev/null
        redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
        redis-benchmark -p "$port" -n 20000 -r 100000000 -c 1 -q FCALL "$lib" 7 "${keys[@]}" \
            acquire fp "id__rand_int__" t b 1 upload 60000 64 0 nonce '' 1 0 >/dev/null
        acquire=$(per_call)
        redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
        redis-benchmark -p "$port" -n 30000 -c 1 -q FCALL "$lib" 7 "${keys[@]}" snapshot fp t b 64 >/dev/null
        echo "round $round $lib: acquire (grant) ${acquire} us/call, snapshot $(per_call) us/call"
    done
done
