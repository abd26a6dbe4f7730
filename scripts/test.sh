#!/usr/bin/env bash
# Run the project's checks and tests with the virtual environment scripts/setup.sh made.
#   bash scripts/test.sh            # everything: lint, types, unit, end-to-end against real
#                                   # opencode servers, browser, a 3-minute soak, then the
#                                   # release matrix
#   bash scripts/test.sh --fast     # the inner loop: lint, types, unit and layer tests (not
#                                   # the few marked stress: the whole run has them)
#   bash scripts/test.sh ARGS...    # lint, types, then pytest ARGS (no release matrix)
# The unit and layer tests run on XAF_HUB_TEST_WORKERS processes (pytest-xdist, default 2; 0
# runs them in this process; auto: one per core). The end-to-end and browser tests run on
# XAF_HUB_E2E_WORKERS processes (default 2; 1 runs them in one process with one fleet): each
# worker starts its own fleet of real servers, and a test file stays on one worker. Most of
# their time is waiting on servers, so two workers on 2 cores measured 29 min against 46 (the
# whole run: 24.1 min on 2026-12-04). pytest's exit 5 ("no tests
# collected") counts as a failure. PYTHON overrides the interpreter.
# What the tests need beyond the demo's set-up comes with them: when the package's test extras
# are missing from the environment, `scripts/setup.sh --test` installs them (and Chromium and
# redis-server where it can); the whole run installs the older opencode releases of the release
# matrix before the end-to-end tests, which start them too (XAF_HUB_SKIP_RELEASES=1: neither).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-${XAF_HUB_VENV:-.venv}/bin/python}
# has_test_tools: every requirement of the [test] extra, as the installed package declares it.
has_test_tools() {
  [ -x "$PY" ] && "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as meta
import re
for req in meta.requires("xaf-hub") or []:
    if 'extra == "test"' in req:
        meta.version(re.split(r"[\s;<>=!~\[]", req, maxsplit=1)[0])
PYEOF
}
if ! has_test_tools; then
  if [ -n "${PYTHON:-}" ]; then
    echo "test: $PY lacks the package's test extras: pip install -e '.[test]' with it" >&2
    exit 1
  fi
  echo "==> the tests' tools are not installed yet: bash scripts/setup.sh --test"
  bash scripts/setup.sh --test || exit 1
fi
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi

# run_pytest ARGS...: pytest, with exit 5 (nothing collected) made a failure.
run_pytest() {
  "$PY" -m pytest "$@"
  local code=$?
  if [ "$code" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    return 1
  fi
  return "$code"
}

# The unit and layer tests: each test file stays on one worker (--dist loadfile), so a
# module's fixtures are built once.
UNIT=(tests/unit tests/test_layers.py)
workers=${XAF_HUB_TEST_WORKERS:-2}
parallel=()
e2e_workers=${XAF_HUB_E2E_WORKERS:-2}
for knob in "XAF_HUB_TEST_WORKERS=$workers" "XAF_HUB_E2E_WORKERS=$e2e_workers"; do
  if ! [[ "${knob#*=}" =~ ^([0-9]+|auto)$ ]]; then
    echo "test: $knob is not a number of workers (0, 1, 2, ... or auto)" >&2
    exit 2
  fi
done
e2e_parallel=()
if "$PY" -c "import xdist" 2>/dev/null; then
  [ "$workers" != "0" ] && parallel=(-n "$workers" --dist loadfile)
  case "$e2e_workers" in 0 | 1) ;; *) e2e_parallel=(-n "$e2e_workers" --dist loadfile) ;; esac
fi

echo "==> ruff check" && "$PY" -m ruff check xaf_hub sandbox tests bench scripts || exit 1
# The two type checks side by side (each about 11 s without a cache), each its own cache;
# Windows runs the hub too: calls that do not exist there (os.killpg, select.poll) fail there.
echo "==> mypy --strict, and mypy --strict --platform win32"
types=$(mktemp -d)
"$PY" -m mypy xaf_hub sandbox >"$types/linux" 2>&1 &
linux=$!
"$PY" -m mypy --platform win32 --cache-dir .mypy_cache/win32 xaf_hub sandbox >"$types/win32" 2>&1
win32=$?
wait "$linux"
linux=$?
cat "$types/linux" "$types/win32"
rm -rf "$types"
[ "$linux" -eq 0 ] && [ "$win32" -eq 0 ] || exit 1
if [ "$fast" -eq 1 ]; then
  echo "==> pytest: unit and layer tests (not the stress tests)"
  run_pytest "${parallel[@]}" -m "not stress" "${UNIT[@]}" "$@"
  exit $?
fi
if [ "$#" -gt 0 ]; then
  echo "==> pytest $*"
  run_pytest "$@"
  exit $?
fi
echo "==> pytest: unit and layer tests"
run_pytest "${parallel[@]}" "${UNIT[@]}"
code=$?
releases=(1.14.41 1.2.27)  # the release matrix (docs/opencode-releases.md)
if [ "${XAF_HUB_SKIP_RELEASES:-0}" != "1" ]; then
  # The end-to-end tests start 1.14.41 beside the pinned release too (a mixed fleet).
  scripts/opencode-releases.sh "${releases[@]}" || code=1
fi
echo "==> pytest: end-to-end and browser tests"
run_pytest "${e2e_parallel[@]}" --durations=15 --ignore=tests/unit --ignore=tests/test_layers.py \
  || code=1
# A 3-minute soak on a fixed seed (bench/soak.py): real faults at random while the invariants
# are checked; it prints its report and fails the run when one broke.
echo "==> soak: 3 minutes, seed 53"
"$PY" -m bench --soak --minutes 3 --seed 53 || code=1
# After the full run, the core subset on older opencode releases (docs/opencode-releases.md).
if [ "${XAF_HUB_SKIP_RELEASES:-0}" != "1" ]; then
  PYTHON="$PY" scripts/release-matrix.sh "${releases[@]}" || code=1
fi
exit "$code"
