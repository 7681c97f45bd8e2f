#!/usr/bin/env bash
# Install configurable-http-proxy@5 into the repository's node_modules/ (git-ignored), so that
# node_modules/.bin/configurable-http-proxy exists. Installs Debian's nodejs + npm when npm is
# missing. Idempotent: an installed proxy of the right major version is left alone.
#   --node-only   only make sure node and npm are installed
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  apt_install nodejs npm
fi
[ "${1:-}" = "--node-only" ] && exit 0

CHP="node_modules/.bin/configurable-http-proxy"
if [ -x "$CHP" ] && node -e 'process.exit(require("./node_modules/configurable-http-proxy/package.json").version.startsWith("5.") ? 0 : 1)' 2>/dev/null; then
  log "configurable-http-proxy $("$CHP" --version) already installed"
  exit 0
fi

# --no-save: no package.json / lock file is written into the repository.
log "npm install configurable-http-proxy@5 (log: var/log/npm-chp.log)"
npm install --no-save --no-audit --no-fund --prefix "$REPO" configurable-http-proxy@5 \
  >"$VAR/log/npm-chp.log" 2>&1 || { tail -n 20 "$VAR/log/npm-chp.log" >&2; die "npm install failed"; }
[ -x "$CHP" ] || die "$CHP missing after npm install"
log "configurable-http-proxy $("$CHP" --version) installed in node_modules/"
