#!/usr/bin/env bash
# Run the project's checks and the whole test suite (unit, end-to-end against real opencode
# servers, browser). pytest's exit 5 ("no tests collected") counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

echo "==> ruff check" && "$PY" -m ruff check xaf_hub tests bench || exit 1
echo "==> mypy --strict" && "$PY" -m mypy xaf_hub || exit 1
echo "==> pytest"
"$PY" -m pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$code"
