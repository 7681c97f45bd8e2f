#!/usr/bin/env bash
# Build the JupyterLab extension in labextension/ into the prebuilt extension
# gpuspawner/labextension_static/ (the wheel installs it as
# share/jupyter/labextensions/gpuspawner-labextension, see pyproject.toml shared-data;
# labextension/install.json is copied into it at every run, built or up to date, so an existing
# prebuilt output that a wheel reuses has it too; pyproject.toml's ensured-targets require it).
# Steps: npm ci (only when node_modules is missing or older than package-lock.json), tsc,
# `jupyter-builder build` (what `jupyter labextension build` runs). Idempotent: skipped when the
# sources' hash matches the last successful build and the output exists.
# `pip install` runs it too: the hatch-jupyter-builder hook in pyproject.toml calls
# `npm run build:prebuilt` (this script) in labextension/, with the build environment's
# jupyter-builder on PATH, so a following `make labext` finds the output up to date.
#   --force   build even when nothing changed
#   --deps    only install node_modules (what the unit tests and `make lint` need)
#   --hook install | --hook run build:prebuilt
#             how `pip install` calls it (pyproject.toml: hatch-jupyter-builder's npm_builder
#             with npm = this script): "install" does nothing (the build runs npm ci itself),
#             "run ..." builds as without arguments
#   --ui-deps only install labextension/ui-tests/node_modules (galata and @playwright/test for
#             the UI tests; no browser is downloaded: they use Debian's /usr/bin/chromium)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

if [ "${1:-}" = "--hook" ]; then
  [ "${2:-}" = "install" ] && exit 0
  set --
fi

EXT="$REPO/labextension"
OUT="$REPO/gpuspawner/labextension_static"
STAMP="$EXT/.build-stamp"
# jupyter-builder (a dependency of jupyterlab; in pip's build environment during `pip install`)
if [ -z "${JUPYTER_BUILDER:-}" ]; then
  if [ -x "$REPO/.venv/bin/jupyter-builder" ]; then
    JUPYTER_BUILDER="$REPO/.venv/bin/jupyter-builder"
  else
    JUPYTER_BUILDER="$(command -v jupyter-builder || true)"
  fi
fi
LOGF="$VAR/log/build-labextension.log"

command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || scripts/install-chp.sh --node-only

if [ "${1:-}" = "--ui-deps" ]; then
  UI="$EXT/ui-tests"
  if [ ! -d "$UI/node_modules" ] || [ "$UI/package-lock.json" -nt "$UI/node_modules/.package-lock.json" ]; then
    log "npm ci in labextension/ui-tests/ (log: var/log/build-labextension.log)"
    (cd "$UI" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund) >"$LOGF" 2>&1 \
      || { tail -n 20 "$LOGF" >&2; die "npm ci in ui-tests failed"; }
    touch "$UI/node_modules/.package-lock.json"
  else
    log "labextension/ui-tests/node_modules is up to date"
  fi
  exit 0
fi
[ -n "$JUPYTER_BUILDER" ] && [ -x "$JUPYTER_BUILDER" ] \
  || die "jupyter-builder not found: run 'make venv' first (jupyterlab is in the test extra)"

if [ ! -d "$EXT/node_modules" ] || [ "$EXT/package-lock.json" -nt "$EXT/node_modules/.package-lock.json" ]; then
  log "npm ci in labextension/ (log: var/log/build-labextension.log)"
  (cd "$EXT" && npm ci --no-audit --no-fund) >"$LOGF" 2>&1 \
    || { tail -n 20 "$LOGF" >&2; die "npm ci failed"; }
  touch "$EXT/node_modules/.package-lock.json"
fi
[ "${1:-}" = "--deps" ] && exit 0

# An editable install (make venv) copies the build output that existed at install time into
# .venv/share/jupyter/labextensions/; replace that copy with a link to the output so the venv's
# JupyterLab always serves the current build (what `jupyter labextension develop` does).
link_into_venv() {
  local share="$REPO/.venv/share/jupyter/labextensions" dest
  [ -d "$share" ] || return 0
  # a git worktree whose .venv links to another checkout's venv: leave that venv's link alone
  if [ -L "$REPO/.venv" ]; then
    log "$REPO/.venv is a link to another checkout's venv; not relinking its labextension"
    return 0
  fi
  dest="$share/gpuspawner-labextension"
  [ -L "$dest" ] && [ "$(readlink "$dest")" = "$OUT" ] && return 0
  rm -rf "$dest"
  ln -s "$OUT" "$dest"
  log "linked $dest -> $OUT"
}

hash_sources() {
  (cd "$EXT" && find src style schema package.json package-lock.json tsconfig.json -type f -print0 \
    | sort -z | xargs -0 sha256sum; "$JUPYTER_BUILDER" --version) | sha256sum | cut -d' ' -f1
}
# labextension/install.json into the output (the wheel ships it from there), when it differs
copy_install_json() {
  cmp -s "$EXT/install.json" "$OUT/install.json" 2>/dev/null && return 0
  mkdir -p "$OUT"
  rm -f "$OUT/install.json"
  cp "$EXT/install.json" "$OUT/install.json"
}

HASH="$(hash_sources)"
if [ "${1:-}" != "--force" ] && [ -f "$OUT/package.json" ] && [ -f "$STAMP" ] \
    && [ "$(cat "$STAMP")" = "$HASH" ]; then
  log "labextension unchanged, $OUT is up to date"
  copy_install_json
  link_into_venv
  exit 0
fi

start=$(date +%s)
log "tsc + jupyter-builder build (log: var/log/build-labextension.log)"
rm -f "$STAMP"
{
  (cd "$EXT" && npx tsc -p tsconfig.json)
  PATH="$(dirname "$JUPYTER_BUILDER"):$PATH" "$JUPYTER_BUILDER" build "$EXT"
} >>"$LOGF" 2>&1 || { tail -n 30 "$LOGF" >&2; die "labextension build failed"; }
[ -f "$OUT/package.json" ] || die "$OUT/package.json missing after the build"
echo "$HASH" >"$STAMP"
copy_install_json
log "built $OUT in $(( $(date +%s) - start )) s"
link_into_venv
