#!/usr/bin/env bash
# The whole test suite as `make test` (and so CI) runs it: two pytest processes side by side.
#
#     bash tests/suite.sh [PYTHON]        # PYTHON: default .venv/bin/python
#
# Serve's HTTP proxy binds 127.0.0.1:8000 on whichever cluster starts it first, so the tests that bind it
# (the session cluster's Serve applications, the end-to-end pipeline's) run one after another in the first
# process (`-m "slow and not own_ports"`), exactly as `pytest -q` runs them. The second process runs the
# rest (`-m "not slow or own_ports"`): the tests that start no Ray, and the Ray tests marked `own_ports`
# (Ray Train, Ray Data, services on ports of their own), on Ray clusters of their own. Each process runs the
# modules that need no tiny model first (tests/conftest.py), while the model builds here in the background
# from the start. The second process's output is printed after the first's. The exit status is the first
# failing process's (pytest's own codes); Ctrl-C stops all.
set -u
cd "$(dirname "$0")/.."
python="${1:-.venv/bin/python}"
# One cluster token before two processes start clusters (each would make its own on a fresh machine).
[ -f "$HOME/.ray/auth_token" ] || "$(dirname "$python")/ray" get-auth-token --generate >/dev/null
build_log="$(mktemp)"
beside_log="$(mktemp)"
"$python" -m jobs.sources.tiny_model >"$build_log" 2>&1 &  # the tests that need the model wait on its build lock
build_pid=$!
"$python" -m pytest -q -m "not slow or own_ports" -p no:cacheprovider >"$beside_log" 2>&1 &
beside_pid=$!
trap 'rm -f "$build_log" "$beside_log"' EXIT
trap 'kill "$build_pid" "$beside_pid" 2>/dev/null; exit 130' INT TERM  # background jobs ignore Ctrl-C: stop them here
"$python" -m pytest -q -m "slow and not own_ports"
port_status=$?
wait "$beside_pid"
beside_status=$?
wait "$build_pid" || { echo "---- the tiny model's build (python -m jobs.sources.tiny_model) failed ----"; cat "$build_log"; }
echo "---- the tests that start no Ray or take ports of their own (pytest -m 'not slow or own_ports'), run beside those above ----"
cat "$beside_log"
exit $((port_status != 0 ? port_status : beside_status))
