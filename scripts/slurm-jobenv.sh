#!/usr/bin/env bash
# The Python that runs notebook jobs on the private Slurm cluster's nodes
# (c.SlurmBackend.job_python; docs/slurm-backend.md "Notebook jobs"): a virtual environment of
# the nodes' /usr/bin/python3 in var/slurm/jobenv with papermill (executes the notebook),
# ipykernel (its python3 kernel) and nbconvert (the HTML export). Job users run it: it lives
# outside /root and is world-readable. The wheels come from the single-user image's wheelhouse
# (var/wheelhouse/pyXY, scripts/build-images.sh) when it has them, else from the package
# index. Idempotent: an environment with the packages is left alone. Prints its python's path.
#   JOBENV_PYTHON   the interpreter to make it from (default /usr/bin/python3)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

BASE_PY="${JOBENV_PYTHON:-/usr/bin/python3}"
ENVDIR="$VAR/slurm/jobenv"
PACKAGES=(papermill ipykernel nbconvert)
[ -x "$BASE_PY" ] || die "no $BASE_PY (set JOBENV_PYTHON to a Python 3 the job users can run)"

if [ -x "$ENVDIR/bin/python" ] \
    && "$ENVDIR/bin/python" -c 'import papermill, ipykernel, nbconvert' 2>/dev/null; then
  echo "$ENVDIR/bin/python"
  exit 0
fi

"$BASE_PY" -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
t=$SECONDS
rm -rf "$ENVDIR"
mkdir -p "$(dirname "$ENVDIR")"
"$BASE_PY" -m venv "$ENVDIR" || die "$BASE_PY -m venv $ENVDIR failed"
TAG="$("$BASE_PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
WHEELS="$VAR/wheelhouse/py$TAG"
if [ -d "$WHEELS" ] && "$ENVDIR/bin/pip" install -q --no-index --find-links "$WHEELS" \
    "${PACKAGES[@]}" >"$VAR/log/jobenv-pip.log" 2>&1; then
  log "job environment from the wheelhouse $WHEELS"
else
  log "installing ${PACKAGES[*]} into $ENVDIR from the package index"
  "$ENVDIR/bin/pip" install -q "${PACKAGES[@]}" >"$VAR/log/jobenv-pip.log" 2>&1 \
    || { tail -n 20 "$VAR/log/jobenv-pip.log" >&2; die "pip install ${PACKAGES[*]} failed"; }
fi
"$ENVDIR/bin/python" -c 'import papermill, ipykernel, nbconvert' \
  || die "$ENVDIR lacks papermill, ipykernel or nbconvert after the install"
chmod -R a+rX "$ENVDIR"
log "job environment ready in $((SECONDS - t)) s: $ENVDIR ($(du -sh "$ENVDIR" | cut -f1))"
echo "$ENVDIR/bin/python"
