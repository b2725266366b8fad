#!/usr/bin/env bash
# What the end-to-end tests run against, installed into the checkout (.node/ is gitignored):
#   Node 22 (the MCP Inspector and the conformance suite need >= 22; Debian has 20),
#   the MCP Inspector CLI, the MCP conformance suite, playwright-core,
#   and Debian's chromium (the browser playwright drives; never a downloaded one).
# Idempotent: a second run checks versions and returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/../.."

NODE_DIR=.node
PACKAGES=(
  "node@22.23.3"
  "@modelcontextprotocol/inspector@2.12.0"
  "@modelcontextprotocol/conformance@0.2.0-alpha.12"
  "playwright-core@1.64.1"
)
STAMP="$NODE_DIR/.installed"
WANT="${PACKAGES[*]}"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || [ ! -x "$NODE_DIR/node_modules/.bin/node" ]; then
  echo "e2e setup: installing ${PACKAGES[*]} into $NODE_DIR/" >&2
  mkdir -p "$NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{"name": "dataref-e2e", "private": true}' > "$NODE_DIR/package.json"
  (cd "$NODE_DIR" && npm install --no-audit --no-fund --loglevel=error "${PACKAGES[@]}")
  echo "$WANT" > "$STAMP"
fi

node_version=$("$NODE_DIR/node_modules/.bin/node" --version)
case "$node_version" in
  v22.*) ;;
  *) echo "e2e setup: expected Node 22 in $NODE_DIR, found $node_version" >&2; exit 1 ;;
esac

if ! command -v chromium >/dev/null 2>&1; then
  echo "e2e setup: installing Debian chromium (for playwright-core)" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null
    $SUDO apt-get install -y --no-install-recommends chromium >/dev/null
  }
fi

echo "e2e setup: node $node_version, $(chromium --version 2>/dev/null | head -1)" >&2
