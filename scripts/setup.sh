#!/usr/bin/env bash
# Install everything xaf-hub, its demo and its tests need; safe to run again.
#  - the package with its test extras (pip, editable)
#  - the real opencode server, pinned, into .opencode/ (npm; git ignores it)
#  - Debian's chromium for the browser tests, when apt-get is available and we are root
#  - Debian's redis-server for the shared-gate tests (same condition); the tests start and stop it
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OPENCODE_VERSION=1.18.33

echo "==> python packages"
"$PY" -m pip install --quiet --disable-pip-version-check -e '.[test]'

echo "==> opencode-ai@${OPENCODE_VERSION} from npm into .opencode/"
if [ ! -x .opencode/node_modules/opencode-ai/bin/opencode.exe ] && \
   [ ! -x .opencode/node_modules/opencode-linux-x64/bin/opencode ] || \
   ! grep -q "\"version\": \"${OPENCODE_VERSION}\"" .opencode/node_modules/opencode-ai/package.json 2>/dev/null; then
  mkdir -p .opencode
  [ -f .opencode/package.json ] || echo '{"name":"xaf-hub-opencode","private":true}' > .opencode/package.json
  npm install --prefix .opencode --no-audit --no-fund --loglevel=error "opencode-ai@${OPENCODE_VERSION}"
fi

if [ "${XAF_HUB_SKIP_BROWSER:-0}" != "1" ] && { [ ! -x /usr/bin/chromium ] || ! fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk"; }; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "==> chromium and a Chinese font (Debian packages) for the browser tests"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei >/dev/null
  else
    echo "note: /usr/bin/chromium missing and apt-get unavailable: browser tests will be skipped"
  fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "==> redis-server (Debian package) for the shared-gate tests"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    # The tests start their own server on a free loopback port; the packaged service is not used.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable --now redis-server >/dev/null 2>&1 || true
    fi
  else
    echo "note: redis-server missing and apt-get unavailable: Redis gate tests will be skipped"
  fi
fi
echo "==> setup done"
