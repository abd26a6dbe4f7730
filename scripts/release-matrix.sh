#!/usr/bin/env bash
# Run the core test subset (pytest -m core: scan and status counts, the 3-process race,
# dispatch to an idle and a running session, interrupt, one heal) against opencode releases:
#   scripts/release-matrix.sh                  # 1.14.41 and 1.2.27
#   scripts/release-matrix.sh 1.3.2 1.15.13    # any releases
# A VERSION not installed yet is installed first (scripts/opencode-releases.sh VERSION, from
# npm; about 550 MB each). The tests' fleet runs that release's binary (XAF_HUB_OPENCODE_BIN) with the usual isolation; the tests
# check that the servers report VERSION. Extra pytest arguments: PYTEST_ARGS="-x -k race".
# Prints one line per release (result, seconds) and exits 1 when any release failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-${XAF_HUB_VENV:-.venv}/bin/python}

versions=("$@")
[ "${#versions[@]}" -eq 0 ] && versions=(1.14.41 1.2.27)
# The releases run side by side (XAF_HUB_MATRIX_SERIAL=1: one after the other): their tests
# mostly wait on servers, so two releases on 2 cores take little more than one. Each run's
# output is kept apart and printed whole when it ends.
failed=0
summary=()
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_release() { # VERSION BIN: the core subset on one release; its exit code in $logs/VERSION.rc
  local v=$1 bin=$2 start code
  start=$(date +%s)
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
  XAF_HUB_OPENCODE_BIN="$bin" XAF_HUB_OPENCODE_VERSION="$v" \
    "$PY" -m pytest tests/e2e -m core -p no:cacheprovider -q --basetemp="$logs/tmp-$v" \
    ${PYTEST_ARGS:-} >"$logs/$v.log" 2>&1
  code=$?
  echo "$code $(( $(date +%s) - start ))" >"$logs/$v.rc"
}
started=()
for v in "${versions[@]}"; do
  if ! bin=$(scripts/opencode-bin.sh "$v") && \
     ! { scripts/opencode-releases.sh "$v" && bin=$(scripts/opencode-bin.sh "$v"); }; then
    echo "error: opencode $v could not be installed; run: scripts/opencode-releases.sh $v" >&2
    summary+=("$v: NOT INSTALLED")
    failed=1
    continue
  fi
  echo "==> core tests on opencode $v ($bin)"
  started+=("$v")
  if [ "${XAF_HUB_MATRIX_SERIAL:-0}" = "1" ]; then
    run_release "$v" "$bin"
  else
    run_release "$v" "$bin" &
  fi
done
wait
for v in "${started[@]}"; do
  echo "==> opencode $v:"
  cat "$logs/$v.log"
  read -r code secs <"$logs/$v.rc" || { code=1; secs=0; }
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
