#!/usr/bin/env bash
# The whole test suite as `make test` (and so CI) runs it: two pytest processes side by side.
#
#     bash tests/suite.sh [PYTHON]        # PYTHON: default .venv/bin/python
#
# Serve's HTTP proxy binds 127.0.0.1:8000 on whichever cluster starts it first, so the tests that bind it
# (the session cluster's Serve applications) run one after another in the first process. The second runs
# the rest beside them: the tests that start no Ray, and the Ray tests marked `own_ports` (Ray Train, Ray
# Data, the end-to-end pipeline on a head whose Serve answers on a free port), on clusters of their own.
# The tests marked `quiet` assert latencies that another process's load breaks (the service under load):
# they run last, alone. The tiny base most tests need is put in the cache first (copied from the shipped
# one, jobs/sources/shipped_base.py; the suite rebuilds its first steps, `--verify` all of it). The second
# process's output is printed after the first's. The exit status is the
# first failing step's (pytest's own codes).
set -u
cd "$(dirname "$0")/.."
python="${1:-.venv/bin/python}"
# Every file that marks tests `quiet` (tests/test_suite_split.py keeps the list whole): the alone stage
# collects these alone, 4 s against 25 s for the whole suite.
quiet_files="tests/serve/test_service_under_load.py"
# One cluster token before two processes start clusters (each would make its own on a fresh machine).
[ -f "$HOME/.ray/auth_token" ] || "$(dirname "$python")/ray" get-auth-token --generate >/dev/null
"$python" -m jobs.sources.tiny_model || exit  # the base, or why it is not there (the tests would each fail on it)
beside_log="$(mktemp)"
"$python" -m pytest -q -m "(not slow or own_ports) and not quiet" -p no:cacheprovider >"$beside_log" 2>&1 &
beside_pid=$!
trap 'rm -f "$beside_log"' EXIT
trap 'kill "$beside_pid" 2>/dev/null; exit 130' INT TERM  # a background job ignores Ctrl-C: stop it here
"$python" -m pytest -q -m "slow and not own_ports and not quiet"
port_status=$?
wait "$beside_pid"
beside_status=$?
echo "---- the tests that start no Ray or take ports of their own (pytest -m '(not slow or own_ports) and not quiet'), run beside those above ----"
cat "$beside_log"
echo "---- the tests that time latencies (pytest -m quiet), alone ----"
"$python" -m pytest -q -m quiet -p no:cacheprovider $quiet_files
quiet_status=$?
for status in $port_status $beside_status $quiet_status; do [ "$status" = 0 ] || exit "$status"; done
