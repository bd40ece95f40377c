#!/usr/bin/env bash
# The test suite in two passes, so that a 2-core host is busy on both cores:
#   1. the single-process tests, TEST_WORKERS (2) at a time (pytest-xdist);
#   2. the multi-process tests (marker `multiproc`: each starts 2-4 gloo ranks, which fill
#      the cores by themselves), one at a time.
# Extra arguments go to both passes (a pass they select nothing in counts as passed).
# Exit status: the first failing pass's, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
status=0
for pass in single multi; do
    if [ "$pass" = single ]; then
        "$PY" -m pytest -q -n "${TEST_WORKERS:-2}" -m "not multiproc" "$@"
    else
        "$PY" -m pytest -q -m multiproc "$@"
    fi
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && [ "$status" -eq 0 ]; then  # 5: no test selected
        status=$rc
    fi
done
exit "$status"
