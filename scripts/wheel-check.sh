#!/usr/bin/env bash
# What a user installs is what the tests test. From this checkout: build the sdist and the wheel
# (python -m build: the wheel is built from the sdist), check their metadata (twine check),
# install the wheel with pipx and with `uv tool install` into throw-away homes, and from an
# empty folder, with no checkout on sys.path, run the installed command against a real opencode
# server (scripts/wheel_smoke.py) and the demo with the installed tool's python. Also measures the
# installed size of the plain and the `[mcp]` installs (each in its own throw-away pipx home: the
# disk size of the tool's environment) and fails above the budget the README states, on its line
# "Install-size budget ...", read from there so the two never disagree (`--budget` prints it and
# stops). .ci/run calls it after the main suite; it fails when the wheel misses a module.
# Environment: PYTHON (the venv python with the test extras, default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

# The budgets in MB, "PLAIN MCP", from the README's one line that states them.
read_budget() {
  local line
  line=$(grep -m1 '^Install-size budget' README.md || true)
  BUDGET_PLAIN=$(sed -n 's/.*plain install \([0-9][0-9]*\) MB.*/\1/p' <<<"$line")
  BUDGET_MCP=$(sed -n 's/.*`\[mcp\]` install \([0-9][0-9]*\) MB.*/\1/p' <<<"$line")
  if [ -z "$BUDGET_PLAIN" ] || [ -z "$BUDGET_MCP" ]; then
    echo "wheel-check: README.md has no line 'Install-size budget: plain install N MB, \`[mcp]\` install M MB'" >&2
    exit 4
  fi
}
read_budget
if [ "${1:-}" = "--budget" ]; then
  echo "plain $BUDGET_PLAIN MB, mcp $BUDGET_MCP MB"
  exit 0
fi
REPO=$(pwd)
PY=${PYTHON:-${XAF_HUB_VENV:-.venv}/bin/python}
BIN=$(dirname "$PY")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/xaf-hub-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
BASE_PY=$("$PY" -c 'import sys; print(sys._base_executable)')
OPENCODE_VERSION=$(sed -n "s/^OPENCODE_VERSION=//p" scripts/setup.sh)
export XAF_HUB_OPENCODE_BIN=${XAF_HUB_OPENCODE_BIN:-$(bash scripts/opencode-bin.sh "$OPENCODE_VERSION")}

echo "==> build the sdist and the wheel from the tracked files (as a fresh clone has them)"
# Not from the tree itself: an editable install's xaf_hub.egg-info/SOURCES.txt would lend the
# build every file it once saw and hide a package the configuration leaves out.
mkdir -p "$WORK/src"
git ls-files -z --cached --others --exclude-standard | (cd "$REPO" && xargs -0 cp --parents -t "$WORK/src" 2>/dev/null || true)
"$PY" -m build --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
WHEEL=$(ls "$WORK"/dist/xaf_hub-*.whl)
echo "    $(basename "$WHEEL"), $(basename "$(ls "$WORK"/dist/xaf_hub-*.tar.gz)")"
echo "==> twine check"
"$PY" -m twine check --strict "$WORK"/dist/*

# smoke NAME BIN_DIR TOOL_PYTHON: the installed command, from an empty folder, no checkout around
smoke() {
  local name=$1 bindir=$2 toolpy=$3 empty="$WORK/empty-$1"
  mkdir -p "$empty"
  echo "==> $name: the installed xaf-hub from an empty folder ($empty)"
  (cd "$empty" && env -u PYTHONPATH "$toolpy" -I "$REPO/scripts/wheel_smoke.py" "$bindir")
  echo "==> $name: the demo with the installed tool's python"
  (cd "$empty" && env -u PYTHONPATH "$toolpy" -I -m xaf_hub.sandbox.demo --out "$empty/demo-out" \
    >"$empty/demo.log" 2>&1) || { tail -40 "$empty/demo.log"; exit 1; }
  grep -q "the overview page for colleagues" "$empty/demo.log"
  [ -s "$empty/demo-out/overview.html" ]
  echo "  ok    demo (overview page written)"
}

echo "==> pipx install the wheel (isolated pipx home)"
export PIPX_HOME="$WORK/pipx" PIPX_BIN_DIR="$WORK/pipx-bin" PIPX_MAN_DIR="$WORK/pipx-man"
"$BIN/pipx" install --python "$BASE_PY" "$WHEEL" >"$WORK/pipx.log" 2>&1 || { cat "$WORK/pipx.log"; exit 1; }
PIPX_VENV="$PIPX_HOME/venvs/xaf-hub"
smoke pipx "$PIPX_BIN_DIR" "$PIPX_VENV/bin/python"

# The README's line that adds the [mcp] extra, run as written (its path made this wheel's) over
# the plain install: pipx refuses a second install of a tool unless the line says how.
mcp_line=$(grep -m1 "^pipx install .*\[mcp\]'" README.md | sed 's/ *#.*//; s/'"'"'//g' || true)
read -ra mcp_args <<<"$mcp_line"
if [ "${mcp_args[0]:-}" != pipx ]; then
  echo "wheel-check: README.md has no line 'pipx install ... /path/to/xaf-hub[mcp]'" >&2
  exit 4
fi
mcp_args=("${mcp_args[@]/#\/path\/to\/xaf-hub/$WHEEL}")

# within_budget WHAT VENV MB: the environment's disk size against its budget
within_budget() {
  local what=$1 venv=$2 budget=$3 size_kb
  size_kb=$(du -sk "$venv" | cut -f1)
  echo "    installed size, $what (pipx venv): $((size_kb / 1024)) MB, budget $budget MB"
  if [ "$size_kb" -gt $((budget * 1024)) ]; then
    echo "wheel-check: the $what install takes $((size_kb / 1024)) MB, over its $budget MB budget (README.md, 'Install-size budget')" >&2
    exit 1
  fi
}
within_budget plain "$PIPX_VENV" "$BUDGET_PLAIN"
# A pipx that installs with pip keeps pip in one environment shared by all its tools (on disk once
# per machine, not counted); one that installs with uv has none
if [ -d "$PIPX_HOME/shared" ]; then
  echo "    pipx's shared pip (once per machine, not counted): $(( $(du -sk "$PIPX_HOME/shared" | cut -f1) / 1024 )) MB"
fi
echo "    the largest parts of the plain install (MB):"
du -sk "$PIPX_VENV"/lib/python*/site-packages/* | sort -rn | head -5 \
  | while read -r kb path; do printf '      %4d  %s\n' $((kb / 1024)) "$(basename "$path")"; done

echo "==> the README's [mcp] line over the plain install: ${mcp_line}"
PIPX_DEFAULT_PYTHON="$BASE_PY" "$BIN/${mcp_args[0]}" "${mcp_args[@]:1}" >"$WORK/pipx-mcp.log" 2>&1 \
  || { cat "$WORK/pipx-mcp.log"; exit 1; }
"$PIPX_VENV/bin/python" -I -c 'import mcp' \
  || { cat "$WORK/pipx-mcp.log"; echo "wheel-check: after the README's [mcp] line, the install cannot import mcp" >&2; exit 1; }
within_budget '[mcp]' "$PIPX_VENV" "$BUDGET_MCP"

echo "==> what \`xaf-hub mcp\` says to run without the extra, run in another plain install"
MCP_HOME="$WORK/pipx-mcp"
export PIPX_HOME="$MCP_HOME" PIPX_BIN_DIR="$WORK/pipx-mcp-bin" PIPX_MAN_DIR="$WORK/pipx-mcp-man"
"$BIN/pipx" install --python "$BASE_PY" "$WHEEL" >"$WORK/pipx-plain2.log" 2>&1 \
  || { cat "$WORK/pipx-plain2.log"; exit 1; }
hint=$(cd "$WORK" && "$PIPX_BIN_DIR/xaf-hub" mcp 2>&1 | grep -o "pipx inject xaf-hub '[^']*'" || true)
read -ra hint_args <<<"${hint//\'/}"
[ "${hint_args[0]:-}" = pipx ] || { echo "wheel-check: xaf-hub mcp names no pipx inject line" >&2; exit 1; }
"$BIN/pipx" "${hint_args[@]:1}" >"$WORK/pipx-inject.log" 2>&1 || { cat "$WORK/pipx-inject.log"; exit 1; }
"$MCP_HOME/venvs/xaf-hub/bin/python" -I -c 'import mcp' \
  || { echo "wheel-check: after '$hint', the install cannot import mcp" >&2; exit 1; }

echo "==> uv tool install the wheel (isolated uv tool folder)"
export UV_TOOL_DIR="$WORK/uv-tools" UV_TOOL_BIN_DIR="$WORK/uv-bin" UV_CACHE_DIR="$WORK/uv-cache"
"$BIN/uv" tool install --python "$BASE_PY" "$WHEEL" >"$WORK/uv.log" 2>&1 || { cat "$WORK/uv.log"; exit 1; }
smoke uv "$UV_TOOL_BIN_DIR" "$UV_TOOL_DIR/xaf-hub/bin/python"
echo "==> wheel check passed"
