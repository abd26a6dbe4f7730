#!/usr/bin/env bash
# Run the project's checks and the whole test suite (unit, end-to-end against real opencode
# servers, browser) with the virtual environment scripts/setup.sh made. pytest's exit 5
# ("no tests collected") counts as a failure. PYTHON overrides the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-${XAF_HUB_VENV:-.venv}/bin/python}
if [ ! -x "$PY" ]; then
  echo "test: no $PY: run bash scripts/setup.sh first" >&2
  exit 1
fi

echo "==> ruff check" && "$PY" -m ruff check xaf_hub tests bench scripts || exit 1
echo "==> mypy --strict" && "$PY" -m mypy xaf_hub || exit 1
# Windows runs the hub too: calls that do not exist there (os.killpg, select.poll) fail here.
echo "==> mypy --strict --platform win32" && "$PY" -m mypy --platform win32 xaf_hub || exit 1
echo "==> pytest"
"$PY" -m pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
# After the full run, the core subset on older opencode releases (docs/opencode-releases.md).
if [ "$#" -eq 0 ] && [ "${XAF_HUB_SKIP_RELEASES:-0}" != "1" ]; then
  PYTHON="$PY" scripts/release-matrix.sh 1.14.41 1.2.27 || code=1
fi
exit "$code"
