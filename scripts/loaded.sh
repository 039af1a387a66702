#!/usr/bin/env bash
# Runs a command as a busy CI runner or a job script would: with two processes keeping the
# cores busy beside it (STOKER_BUSY sets how many), and with SIGINT ignored, as a
# non-interactive shell starts a background command (children inherit that). The test suite
# must pass so: the signal tests set the disposition they need in the processes they start.
#
#   bash scripts/loaded.sh bash scripts/test.sh
set -euo pipefail
busy=()
stop_busy() { ((${#busy[@]})) && kill "${busy[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap stop_busy EXIT
for _ in $(seq "${STOKER_BUSY:-2}"); do
  sh -c 'while :; do :; done' &
  busy+=($!)
done
trap '' INT
"$@"
