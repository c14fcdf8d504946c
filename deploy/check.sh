#!/usr/bin/env bash
# The deploy check: runs deploy/ for real, as an operator would, and fails on anything wrong.
#   1. builds the node and trainer images (deploy/Dockerfile, deploy/trainer.Dockerfile) through compose
#   2. brings deploy/compose.yaml up (S3, seed, token, three nodes, standalone sidecar, Prometheus)
#      and waits until the three nodes are healthy (their /readyz: a trainer's request path answers)
#   3. checks the nodes see each other and the standalone sidecar is ready
#   4. runs the trainer (2 ranks x 4 streams, CHECK_EPOCHS shuffled epochs of the image column in
#      small messages, a stand-in training step per batch, so streams are open while it trains),
#      checks every node served rows in epoch 0, kills the node it dials (the first of its --location
#      list) with SIGKILL in the middle of an epoch (from epoch 1 on, as soon as that node has
#      streams in flight), and checks every epoch delivered every row exactly once, that the kill
#      epoch recovered from the loss (failovers, retries, hedged messages or dropped duplicates: the
#      trainer's per-epoch counts; a kill that landed after the node's last message tested nothing,
#      so the node is restarted and the trainer run again with the kill earlier) and that the epochs
#      after the loss keep the healthy pace (CHECK_SLOWDOWN)
#   5. tears everything down (volumes included) and prints a summary; exit 0 only when all passed
# Needs Docker and Compose v2 (`docker compose`). Downloads base images and wheels (torch's CPU
# wheel: about 0.2 GB), so it is not part of .ci/run: run it before closing a change to deploy/,
# the cluster or the client's failover (`./run deploy-check`), and record the result in
# bench/history.md. Settings (environment):
#   DOCKER               the docker CLI (default: docker)
#   PYTHON_IMAGE         base image of both images (default python:3.11-slim; a mirror or a local stand-in)
#   TORCH_INDEX_URL      where the trainer's CPU torch comes from (default the PyTorch CPU index; set it
#                        empty to let pip's own configuration in the base image provide the wheel)
#   CHECK_COMPOSE_FILES  extra compose files, space-separated (e.g. one giving builds the host network)
#   CHECK_PROJECT        compose project name (default flightfeed-check)
#   CHECK_EPOCHS         epochs the trainer reads (default 4; the kill lands in epoch 1, normally)
#   CHECK_STEP_SECONDS   the stand-in training step per batch (default 0.05: epochs of several seconds)
#   CHECK_WINDOW_BYTES   how far each rank fetches ahead of its training step (default 8 MiB, ~10 of the
#                        0.8 MB messages): streams stay in flight through the epoch, so the kill hits them
#   CHECK_KILL_ATTEMPTS  trainer runs at most (default 3): a kill that landed after the node's last message
#                        (the trainer noticed nothing) restarts the node and kills earlier in a new run
#   CHECK_SLOWDOWN       an epoch after the loss may take this many times the healthy epoch (default 1.2)
#   CHECK_KEEP=1         leave the stack up when the check fails (to look at it); then tear down by hand
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DOCKER=${DOCKER:-docker}
PROJECT=${CHECK_PROJECT:-flightfeed-check}
EPOCHS=${CHECK_EPOCHS:-4}
STEP=${CHECK_STEP_SECONDS:-0.05}
WINDOW=${CHECK_WINDOW_BYTES:-8388608}
ATTEMPTS=${CHECK_KILL_ATTEMPTS:-3}
SLOWDOWN=${CHECK_SLOWDOWN:-1.2}
ROWS=65536  # what the compose seed job writes (4 shards x 16384 rows)
export PYTHON_IMAGE=${PYTHON_IMAGE:-python:3.11-slim}
export TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/flightfeed-deploy-check.XXXXXX")

files=(-f "$HERE/compose.yaml")
for f in ${CHECK_COMPOSE_FILES:-}; do files+=(-f "$f"); done
compose() { "$DOCKER" compose -p "$PROJECT" "${files[@]}" "$@"; }

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
summary=()
note() { echo "deploy-check: $*"; summary+=("$*"); }
failed=""
fail() { failed="$*"; echo "deploy-check: FAILED: $*" >&2; exit 1; }

finish() {
    local rc=$?
    if [ -n "$failed" ] || [ "$rc" != 0 ]; then
        echo "--- last logs of the stack ---" >&2
        compose logs --no-color --tail 30 >&2 2>/dev/null || true
        [ -f "$WORK/trainer.log" ] && { echo "--- trainer ---" >&2; cat "$WORK/trainer.log" >&2; }
    fi
    if [ "${CHECK_KEEP:-0}" = 1 ] && [ "$rc" != 0 ]; then
        echo "deploy-check: the stack is left up (CHECK_KEEP=1): docker compose -p $PROJECT ${files[*]} down -v" >&2
    else
        local t=$(now)
        compose down -v --remove-orphans --timeout 30 >"$WORK/down.log" 2>&1 || echo "deploy-check: compose down failed (see $WORK/down.log)" >&2
        summary+=("teardown (compose down -v): $(since "$t") s")
    fi
    echo
    echo "=== deploy check summary ==="
    printf '  %s\n' "${summary[@]}"
    if [ "$rc" = 0 ]; then echo "  RESULT: PASS"; else echo "  RESULT: FAIL${failed:+ ($failed)}"; fi
    rm -rf "$WORK"
    exit "$rc"
}
trap finish EXIT

"$DOCKER" compose version >/dev/null 2>&1 \
    || fail "Docker Compose v2 is missing (\`$DOCKER compose version\` fails); install the compose plugin"
"$DOCKER" info >/dev/null 2>&1 || fail "no Docker daemon answers \`$DOCKER info\`"
note "docker $("$DOCKER" version --format '{{.Server.Version}}'), $("$DOCKER" compose version --short 2>/dev/null || echo compose v2), base image $PYTHON_IMAGE, torch index ${TORCH_INDEX_URL:-(pip configuration)}"
compose down -v --remove-orphans --timeout 10 >/dev/null 2>&1 || true  # a previous run's leftovers

# -- 1. images -----------------------------------------------------------------------------
size() { "$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{printf "%.2f GB", $1 / 1e9}'; }
t=$(now); compose build flightfeed-1 >"$WORK/build-node.log" 2>&1 \
    || { tail -n 40 "$WORK/build-node.log" >&2; fail "building the node image"; }
note "node image flightfeed:latest built in $(since "$t") s: $(size flightfeed:latest)"
if grep -qiE "(collecting|downloading|processing|installing).*torch" "$WORK/build-node.log"; then
    fail "the node image build installed torch"
fi
t=$(now); compose build trainer >"$WORK/build-trainer.log" 2>&1 \
    || { tail -n 40 "$WORK/build-trainer.log" >&2; fail "building the trainer image"; }
note "trainer image flightfeed-trainer:latest built in $(since "$t") s: $(size flightfeed-trainer:latest)"

# -- 2. the stack ----------------------------------------------------------------------------
t=$(now)
compose up -d --no-build s3 seed token-init flightfeed-1 flightfeed-2 flightfeed-3 sidecar prometheus \
    >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; fail "compose up"; }
health() { "$DOCKER" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$1"; }
deadline=$(( $(date +%s) + 240 ))
for node in flightfeed-1 flightfeed-2 flightfeed-3; do
    id=$(compose ps -q "$node")
    [ -n "$id" ] || fail "$node has no container (see compose logs)"
    until [ "$(health "$id")" = healthy ]; do
        state=$(health "$id")
        [ "$state" = exited ] && fail "$node exited before it was healthy"
        [ "$(date +%s)" -lt "$deadline" ] || fail "$node not healthy within 240 s (state: $state)"
        sleep 1
    done
done
note "stack up, three nodes healthy (their /readyz) in $(since "$t") s"

# -- 3. cluster and sidecar ----------------------------------------------------------------------
STATS='import json, sys, urllib.request as u
token = open("/run/flightfeed/token").read().strip()
req = u.Request("http://127.0.0.1:8816/stats", headers={"Authorization": "Bearer " + token})
s = json.load(u.urlopen(req, timeout=10))
print(s["cluster"]["peers_live"], s["totals"]["rows"], s["streams_active"])'
stats() { compose exec -T "$1" python -c "$STATS"; }
for node in flightfeed-1 flightfeed-2 flightfeed-3; do
    peers=""
    for _ in $(seq 30); do read -r peers _ _ < <(stats "$node") && [ "$peers" = 2 ] && break; sleep 1; done
    [ "$peers" = 2 ] || fail "$node sees $peers live peers, not 2"
done
note "each node sees the two others live"
compose exec -T sidecar python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8816/readyz', timeout=5)" \
    || fail "the standalone sidecar's /readyz is not 200"
note "the standalone sidecar is ready (/readyz 200)"

# -- 4. the trainer, and a node killed mid-epoch ------------------------------------------------
mapfile -t cmd < <(compose config --format json | python3 -c '
import json, sys
for arg in json.load(sys.stdin)["services"]["trainer"]["command"]:
    print(arg)')
dialed=$(printf '%s\n' "${cmd[@]}" | grep -A1 -x -- --location | tail -n1 | cut -d, -f1)
victim=$(python3 -c "import sys, urllib.parse as p; print(p.urlparse(sys.argv[1]).hostname)" "$dialed")
extra=(--epochs "$EPOCHS" --step-seconds "$STEP" --column image --message-rows 256 --window-bytes "$WINDOW")
note "trainer: ${cmd[*]} ${extra[*]}; dials $dialed first"

wait_tier() {  # the three nodes healthy again and each seeing the two others
    local node id peers deadline=$(( $(date +%s) + 240 ))
    for node in flightfeed-1 flightfeed-2 flightfeed-3; do
        id=$(compose ps -q "$node")
        until [ "$(health "$id")" = healthy ]; do
            [ "$(date +%s)" -lt "$deadline" ] || fail "$node not healthy again within 240 s"
            sleep 1
        done
    done
    for node in flightfeed-1 flightfeed-2 flightfeed-3; do
        peers=""
        for _ in $(seq 60); do read -r peers _ _ < <(stats "$node") && [ "$peers" = 2 ] && break; sleep 1; done
        [ "$peers" = 2 ] || fail "$node sees $peers live peers, not 2, after $victim was restarted"
    done
}

# one trainer run with a kill of $victim in epoch 1: attempt 1 kills once $victim's /stats shows
# streams in flight; a later attempt (the one before landed after the node's last message) kills
# earlier, as soon as a rank has the epoch's first batch (no /stats round trip first)
run_trainer() {
    local attempt=$1 log="$WORK/trainer-$1.log"
    ln -sf "$log" "$WORK/trainer.log"
    t_train=$(now)
    compose run --rm --no-deps -T trainer "${cmd[@]}" "${extra[@]}" >"$log" 2>&1 &
    trainer=$!
    local mark="^epoch 1: started"
    [ "$attempt" -gt 1 ] && mark="^epoch 1: rank [0-9]* has its first batch"
    until grep -q "$mark" "$log"; do
        kill -0 "$trainer" 2>/dev/null || { wait "$trainer" || true; fail "the trainer ended before epoch 1 (log above)"; }
        sleep 0.1
    done
    active=0
    if [ "$attempt" = 1 ]; then
        served=""
        for node in flightfeed-1 flightfeed-2 flightfeed-3; do
            read -r _ rows _ < <(stats "$node") || fail "cannot read the /stats of $node"
            served+="$node $rows, "
            [ "$rows" -gt 0 ] || fail "$node served no rows in epoch 0: endpoints are not spread over every node"
        done
        note "rows served per node by the start of epoch 1: ${served%, }"
        active=0
        until [ "$active" -gt 0 ]; do  # the node must be serving when it dies: streams in flight on it
            kill -0 "$trainer" 2>/dev/null || { wait "$trainer" || true; fail "the trainer ended before $victim had streams in flight"; }
            read -r _ _ active < <(stats "$victim") || active=0
        done
    fi
    compose kill -s SIGKILL "$victim" >/dev/null 2>&1 || fail "could not kill $victim"
    t_kill=$(now)
    kill_epoch=$(( $(grep -c "^epoch [0-9]*: started" "$log") - 1 ))
    local how="$active stream(s) in flight on it by its /stats"
    [ "$attempt" = 1 ] || how="as soon as a rank had the epoch's first batch"
    note "attempt $attempt: killed $victim (SIGKILL) in the middle of epoch $kill_epoch ($how)"
    status=0; wait "$trainer" || status=$?
    sed 's/^/    trainer | /' "$log"
    [ "$status" = 0 ] || fail "the trainer exited with $status after $victim was killed"
    note "trainer finished $(since "$t_kill") s after the kill; $(since "$t_train") s in all"
    for e in $(seq 0 $((EPOCHS - 1))); do
        line=$(grep -E "^epoch $e: [0-9,]+ rows" "$log") || fail "epoch $e reported nothing"
        case "$line" in
            *"every row exactly once"*) note "$line" ;;
            *) fail "epoch $e: $line" ;;
        esac
        rows=$(sed -nE 's/^epoch [0-9]+: ([0-9,]+) rows.*/\1/p' <<<"$line" | tr -d ,)
        [ "$rows" = "$ROWS" ] || fail "epoch $e delivered $rows rows, not $ROWS"
    done
}

# how epoch $1 recovered: "failovers retries moved hedged duplicates" (the trainer's counts)
recovery() {
    grep -E "^epoch $1: [0-9,]+ rows" "$WORK/trainer.log" | sed -nE \
        's/.* ([0-9]+) failover\(s\), ([0-9]+) retries, ([0-9]+) moved, ([0-9]+) hedged, ([0-9]+) duplicates dropped.*/\1 \2 \3 \4 \5/p'
}

attempt=1
while :; do
    run_trainer "$attempt"
    read -r failovers retries moved hedged duplicates < <(recovery "$kill_epoch") \
        || fail "epoch $kill_epoch reports no recovery counts"
    # the loss was noticed when a stream failed at the dead node (failovers, retries) or more
    # messages were requested again elsewhere (hedged) than in any healthy epoch before the kill;
    # "moved" (and a few hedges) alone prove nothing: healthy epochs move and hedge work too
    healthy_hedged=0
    for e in $(seq 0 $((kill_epoch - 1))); do
        read -r _ _ _ h _ < <(recovery "$e") && [ "$h" -gt "$healthy_hedged" ] && healthy_hedged=$h
    done
    if [ $(( failovers + retries )) -gt 0 ] || [ "$hedged" -gt "$healthy_hedged" ]; then
        note "epoch $kill_epoch recovered from the loss of $victim: $failovers failover(s), $retries retries, $moved moved, $hedged hedged (at most $healthy_hedged in a healthy epoch), $duplicates duplicates dropped; every row exactly once"
        break
    fi
    [ "$attempt" -lt "$ATTEMPTS" ] \
        || fail "in $ATTEMPTS attempts the kill never hit $victim's streams in flight (no failover or retry, no more hedges than healthy, in the kill epoch)"
    note "attempt $attempt: the kill landed after $victim's last message of epoch $kill_epoch (no failover or retry, $hedged hedged against $healthy_hedged healthy: not a test of recovery); restarting $victim and killing earlier"
    compose start "$victim" >"$WORK/restart.log" 2>&1 || { cat "$WORK/restart.log" >&2; fail "restarting $victim"; }
    wait_tier
    attempt=$((attempt + 1))
done

# the pace after the loss: every later epoch against the healthy ones (before the kill)
read -r verdict text < <(python3 - "$WORK/trainer.log" "$kill_epoch" "$SLOWDOWN" <<'PY'
import re, sys
times = {int(m[1]): float(m[2]) for m in re.finditer(r"^epoch (\d+): [\d,]+ rows .* in ([\d.]+) s,", open(sys.argv[1]).read(), re.M)}
kill, limit = int(sys.argv[2]), float(sys.argv[3])
healthy = [t for e, t in times.items() if e < kill]
after = {e: t for e, t in times.items() if e > kill}
if not healthy or not after:
    print("ok no healthy epoch or none after the loss to compare")
    sys.exit()
base = min(healthy)
worst = max(after.values()) / base
each = ", ".join(f"epoch {e} {t:.2f} s ({t / base:.2f}x)" for e, t in sorted(after.items()))
print(("ok" if worst <= limit else "slow"), f"healthy epoch {base:.2f} s; after the loss: {each}; limit {limit:g}x")
PY
)
note "pace after the loss: $text"
[ "$verdict" = ok ] || fail "an epoch after the loss of $victim is slower than ${SLOWDOWN}x the healthy one ($text)"
note "every epoch: all $ROWS rows exactly once, across the loss of $victim"
