#!/usr/bin/env bash
# Run the core test subset (pytest -m core: scan and status counts, the 3-process race,
# dispatch to an idle and a running session, interrupt, one heal) against opencode releases:
#   scripts/release-matrix.sh                  # 1.14.41 and 1.2.27
#   scripts/release-matrix.sh 1.3.2 1.15.13    # any installed releases
# Each VERSION must be installed first (scripts/opencode-releases.sh VERSION). The tests'
# fleet runs that release's binary (XAF_HUB_OPENCODE_BIN) with the usual isolation; the tests
# check that the servers report VERSION. Extra pytest arguments: PYTEST_ARGS="-x -k race".
# Prints one line per release (result, seconds) and exits 1 when any release failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

versions=("$@")
[ "${#versions[@]}" -eq 0 ] && versions=(1.14.41 1.2.27)
failed=0
summary=()
for v in "${versions[@]}"; do
  if ! bin=$(scripts/opencode-bin.sh "$v"); then
    echo "error: opencode $v is not installed; run: scripts/opencode-releases.sh $v" >&2
    summary+=("$v: NOT INSTALLED")
    failed=1
    continue
  fi
  echo "==> core tests on opencode $v ($bin)"
  start=$(date +%s)
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
  XAF_HUB_OPENCODE_BIN="$bin" XAF_HUB_OPENCODE_VERSION="$v" \
    "$PY" -m pytest tests/e2e -m core -p no:cacheprovider -q ${PYTEST_ARGS:-}
  code=$?
  secs=$(( $(date +%s) - start ))
  if [ "$code" -eq 0 ]; then
    summary+=("$v: passed in ${secs}s")
  else
    [ "$code" -eq 5 ] && echo "error: pytest collected no core tests" >&2
    summary+=("$v: FAILED (pytest exit $code) in ${secs}s")
    failed=1
  fi
done
echo "==> release matrix (core subset)"
printf '  %s\n' "${summary[@]}"
exit "$failed"
