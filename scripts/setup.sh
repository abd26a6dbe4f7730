#!/usr/bin/env bash
# Set-up from a checkout; safe to run again.
#   bash scripts/setup.sh          # what the demo needs, nothing more:
#     - a project virtual environment in .venv/ (never the system interpreter: PEP 668 safe)
#       holding the package, editable
#     - the real opencode server, pinned, into .opencode/ (npm; git ignores it)
#   bash scripts/setup.sh --test   # and what the tests need (scripts/test.sh runs this itself
#                                  # when its tools are missing):
#     - the package's test extras in .venv/
#     - Debian's chromium for the browser tests, when apt-get is available and we are root
#     - Debian's redis-server for the shared-gate tests (same condition); the tests start it
#     - Debian's bubblewrap (same condition): the sandbox the project's check runs in
# The older opencode releases of the release matrix come with the test command
# (scripts/release-matrix.sh installs each the first time it needs it).
# Anything missing that this script cannot install is named in one line with how to get it.
# Environment: PYTHON (interpreter that creates the venv, default python3), XAF_HUB_VENV (default
# .venv), XAF_HUB_SKIP_BROWSER=1 (no chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
tests=0
case "${1:-}" in
  "") ;;
  --test) tests=1 ;;
  *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 4 ;;
esac

PY=${PYTHON:-python3}
VENV=${XAF_HUB_VENV:-.venv}
OPENCODE_VERSION=1.18.33

can_apt() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; }
apt_updated=0
apt_install() {  # apt_install PACKAGE...: Debian packages, quietly
  if [ "$apt_updated" = 0 ]; then apt-get update -qq >/dev/null; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
missing() {  # missing WHAT HOW: the one line a user needs, then stop
  echo "setup: missing $1: $2, then run this script again" >&2
  exit 1
}

# install_opencode VERSION DIR: opencode-ai@VERSION from npm into DIR (skipped when present).
install_opencode() {
  local version=$1 dir=$2
  if [ -x "$dir/node_modules/opencode-linux-x64/bin/opencode" ] || \
     [ -x "$dir/node_modules/opencode-ai/bin/opencode.exe" ]; then
    if grep -q "\"version\": \"${version}\"" "$dir/node_modules/opencode-ai/package.json" 2>/dev/null; then
      return 0
    fi
  fi
  echo "==> opencode-ai@${version} from npm into ${dir}/"
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name":"xaf-hub-opencode","private":true}' > "$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "opencode-ai@${version}"
}

echo "==> python virtual environment in ${VENV}/"
command -v "$PY" >/dev/null 2>&1 || missing "Python 3.11+ ($PY)" "install python3 (Debian: apt-get install python3 python3-venv)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
  missing "Python 3.11+ ($PY is $("$PY" -c 'import platform; print(platform.python_version())'))" \
    "install a newer Python and run with PYTHON=/path/to/python3.11"
if [ ! -x "$VENV/bin/python" ]; then
  # Debian and Ubuntu ship venv's pip bootstrap (ensurepip) in a separate package.
  if ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || ! "$PY" -m venv "$VENV" >/dev/null 2>&1; then
    rm -rf "$VENV"
    if can_apt; then
      echo "==> python3-venv (Debian package) for the virtual environment"
      apt_install python3-venv
      "$PY" -m venv "$VENV"
    else
      missing "Python's venv module" "sudo apt-get install python3-venv (Debian/Ubuntu) or your distribution's equivalent"
    fi
  fi
fi
VPY=$VENV/bin/python
if [ "$tests" = 1 ]; then
  echo "==> the package with its test extras"
  "$VPY" -m pip install --quiet --disable-pip-version-check -e '.[test]'
else
  "$VPY" -m pip install --quiet --disable-pip-version-check -e .
fi

if ! command -v npm >/dev/null 2>&1; then
  if can_apt; then
    echo "==> npm (Debian package) to fetch opencode"
    apt_install npm
  else
    missing "npm (needed to fetch opencode)" "sudo apt-get install npm, or Node.js 18+ from https://nodejs.org"
  fi
fi
install_opencode "$OPENCODE_VERSION" .opencode
if [ "$tests" = 0 ]; then
  echo "==> setup done; the environment's python is ${VPY} (the tests' tools: bash scripts/setup.sh --test, or bash scripts/test.sh)"
  exit 0
fi

if [ "${XAF_HUB_SKIP_BROWSER:-0}" != "1" ] && { [ ! -x /usr/bin/chromium ] || ! fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk"; }; then
  if can_apt; then
    echo "==> chromium and a Chinese font (Debian packages) for the browser tests"
    apt_install chromium fonts-wqy-microhei
  else
    echo "note: no /usr/bin/chromium (sudo apt-get install chromium fonts-wqy-microhei): browser tests will be skipped"
  fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
  if can_apt; then
    echo "==> redis-server (Debian package) for the shared-gate tests"
    apt_install redis-server
    # The tests start their own server on a free loopback port; the packaged service is not used.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable --now redis-server >/dev/null 2>&1 || true
    fi
  else
    echo "note: no redis-server (sudo apt-get install redis-server): Redis gate tests will be skipped"
  fi
fi
if ! command -v bwrap >/dev/null 2>&1; then
  if can_apt; then
    echo "==> bubblewrap (Debian package): the sandbox the project's check runs in"
    apt_install bubblewrap
  else
    echo "note: no bwrap (sudo apt-get install bubblewrap): project checks will not run (docs/verification.md) and their tests will be skipped"
  fi
fi
echo "==> setup done, with the tests' tools; the environment's python is ${VPY}"
