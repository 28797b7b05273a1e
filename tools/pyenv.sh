#!/bin/sh
# The Python venv of the tests and the demo: VENV (default $BUILD/pyenv,
# BUILD default build) with the pins of tests/requirements.txt, plus
# tests/requirements-nodeps.txt installed without dependencies. Rebuilt when
# the pins change; does nothing when they have not. Needs python3-venv
# (tools/install-deps.sh) and PyPI the first time.
#   sh tools/pyenv.sh [VENV]
set -eu
venv=${1:-${BUILD:-build}/pyenv}
stamp=$venv/requirements.txt
want=$(cat tests/requirements.txt tests/requirements-nodeps.txt)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
	exit 0
fi
echo "pyenv: installing tests/requirements.txt into $venv" >&2
rm -f "$stamp"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r tests/requirements.txt
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -r tests/requirements-nodeps.txt
printf '%s\n' "$want" >"$stamp"
