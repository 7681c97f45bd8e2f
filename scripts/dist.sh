#!/usr/bin/env bash
# Build what a site installs (`make dist`): into dist/ (DIST_DIR), the wheel and the sdist of
# gpuspawner at pyproject.toml's version, the prebuilt JupyterLab extension inside both
# (scripts/build-labextension.sh; Node.js is needed here, never on the hub machine), and
# dist/wheelhouse/: the wheel and every wheel that `gpuspawner[hub]` needs, so a hub machine
# without a route to PyPI installs with
#   pip install --no-index --find-links wheelhouse "gpuspawner[hub]==VERSION"
# (docs/install.md). Needs the network (PyPI) for the build back-end and the dependencies,
# through pip's cache after the first run. Idempotent: a wheel and sdist of the same version
# and sources are rebuilt (cheap: the lab extension's build is skipped when up to date).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$REPO"

PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || die "no .venv: run 'make venv' first"
OUT="${DIST_DIR:-$REPO/dist}"
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
LOGF="$VAR/log/dist.log"
: >"$LOGF"

scripts/build-labextension.sh
mkdir -p "$OUT"
rm -f "$OUT"/gpuspawner-*.whl "$OUT"/gpuspawner-*.tar.gz
log "python -m build: sdist and wheel of gpuspawner $VERSION -> $OUT (log: $LOGF)"
"$PY" -m build --sdist --wheel --outdir "$OUT" . >>"$LOGF" 2>&1 \
  || { tail -n 30 "$LOGF" >&2; die "python -m build failed (log: $LOGF)"; }
WHEEL="$OUT/gpuspawner-$VERSION-py3-none-any.whl"
[ -f "$WHEEL" ] || die "the build made no $WHEEL"
log "pip wheel: $WHEEL with the hub extra's dependencies -> $OUT/wheelhouse"
rm -rf "$OUT/wheelhouse"
"$PY" -m pip wheel -q --disable-pip-version-check -w "$OUT/wheelhouse" "$WHEEL[hub]" \
  >>"$LOGF" 2>&1 \
  || { tail -n 30 "$LOGF" >&2; die "pip wheel failed (log: $LOGF)"; }
log "dist ready: $(basename "$WHEEL"), gpuspawner-$VERSION.tar.gz," \
  "$(find "$OUT/wheelhouse" -name '*.whl' | wc -l) wheels in wheelhouse/ ($(du -sh "$OUT/wheelhouse" | cut -f1))"
