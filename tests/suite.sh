#!/usr/bin/env bash
# The whole test suite as `make test` (and so CI) runs it: two pytest processes side by side.
#
#     bash tests/suite.sh [PYTHON]        # PYTHON: default .venv/bin/python
#
# The tests on a Ray cluster (`-m slow`: the session's cluster, head nodes, Serve on port 8000,
# the end-to-end pipeline) run one after another in one process, exactly as `pytest -q` runs them;
# every other test (`-m "not slow"`: no Ray) runs in a second process beside them, in the CPU
# time the cluster tests leave idle (their Serve health checks, job polling, process start-ups).
# The second process's output is printed after the first's. The exit status is the first
# failing process's (pytest's own codes); Ctrl-C stops both.
set -u
cd "$(dirname "$0")/.."
python="${1:-.venv/bin/python}"
quick_log="$(mktemp)"
"$python" -m pytest -q -m "not slow" -p no:cacheprovider >"$quick_log" 2>&1 &
quick_pid=$!
trap 'rm -f "$quick_log"' EXIT
trap 'kill "$quick_pid" 2>/dev/null; exit 130' INT TERM  # a background job ignores Ctrl-C: stop it here
"$python" -m pytest -q -m slow
cluster_status=$?
wait "$quick_pid"
quick_status=$?
echo "---- the tests that start no Ray (pytest -m 'not slow'), run beside those above ----"
cat "$quick_log"
exit $((cluster_status != 0 ? cluster_status : quick_status))
