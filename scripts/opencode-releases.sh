#!/usr/bin/env bash
# Install opencode releases side by side for the release matrix:
#   scripts/opencode-releases.sh 1.14.41 1.2.27
# Each VERSION goes to .opencode-releases/VERSION/ (git ignores it; about 390 MB each) from npm
# (opencode-ai@VERSION). A version already installed there is skipped. Prints nothing else
# on success; exits non-zero naming the first version that failed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$#" -eq 0 ]; then
  echo "usage: scripts/opencode-releases.sh VERSION..." >&2
  exit 4
fi
for v in "$@"; do
  if ! [[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "error: '$v' is not a release number like 1.14.41" >&2
    exit 4
  fi
done

for v in "$@"; do
  dir=".opencode-releases/$v"
  if scripts/opencode-bin.sh "$v" >/dev/null 2>&1; then
    echo "==> opencode-ai@$v already installed: $(scripts/opencode-bin.sh "$v")"
    continue
  fi
  echo "==> opencode-ai@$v from npm into $dir/"
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name":"xaf-hub-opencode-release","private":true}' > "$dir/package.json"
  if ! npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "opencode-ai@$v"; then
    echo "error: npm could not install opencode-ai@$v" >&2
    exit 1
  fi
  if ! scripts/opencode-bin.sh "$v" >/dev/null; then
    echo "error: opencode-ai@$v installed but its binary does not run" >&2
    exit 1
  fi
done
