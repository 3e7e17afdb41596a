#!/bin/sh
# The install steps of deploy/Dockerfile's build stage, kept in one place: tests/integration/test_deploy.py runs
# this same script into a fresh virtual environment, so what the image installs is what the test exercised.
#
#   deploy/install.sh VENV [SOURCE]     # VENV: where the virtual environment goes; SOURCE: the source tree (.)
set -eu
venv="$1"
source_tree="${2:-.}"
python3 -m venv "$venv"
"$venv/bin/pip" install --no-cache-dir --disable-pip-version-check "$source_tree"
"$venv/bin/mcp-lossless" --version
