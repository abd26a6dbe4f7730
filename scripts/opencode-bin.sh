#!/usr/bin/env bash
# Print the path of the opencode binary installed for VERSION under .opencode-releases/
# (the platform package's binary, which works even when npm skipped the postinstall).
# Exits 1 when it is missing or does not report VERSION.
set -uo pipefail
cd "$(dirname "$0")/.."
v=${1:?usage: scripts/opencode-bin.sh VERSION}
nm="$PWD/.opencode-releases/$v/node_modules"
# The pinned release of scripts/setup.sh lives in .opencode/; use it when it is this version.
if [ ! -d "$nm" ] && grep -q "\"version\": \"$v\"" .opencode/node_modules/opencode-ai/package.json 2>/dev/null; then
  nm="$PWD/.opencode/node_modules"
fi
case "$(uname -m)" in x86_64|amd64) arch=x64 ;; aarch64|arm64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
os=$(uname -s | tr '[:upper:]' '[:lower:]')
tmp_home=$(mktemp -d)
trap 'rm -rf "$tmp_home"' EXIT
for cand in "$nm/opencode-$os-$arch/bin/opencode" "$nm/opencode-$os-$arch-baseline/bin/opencode"; do
  if [ -x "$cand" ] && [ "$(HOME=$tmp_home XDG_CONFIG_HOME=$tmp_home XDG_DATA_HOME=$tmp_home XDG_CACHE_HOME=$tmp_home XDG_STATE_HOME=$tmp_home "$cand" --version 2>/dev/null)" = "$v" ]; then
    echo "$cand"
    exit 0
  fi
done
exit 1
