#!/usr/bin/env bash
# Regenerate constraints.txt: the exact versions (every package, transitive included) that the
# README's install command uses and that the test suite passes with.
#
# In a fresh virtualenv in a temporary directory it installs torch (TORCH_SPEC, default
# torch==2.13.0), then this checkout with its test extra and its optional extras from the ranges
# of requirements.txt and pyproject.toml: with KEEP_PINS=1, under today's constraints.txt (a
# package it pins keeps its version; a new one gets the newest its range allows), otherwise
# without constraints, so pip takes the newest versions the ranges allow. It
# freezes that environment into a candidate file and runs the test suite there
# (python -m pytest -q, plus any arguments given to this script). Only when the suite passes does
# the candidate replace constraints.txt; otherwise the script exits non-zero, leaves
# constraints.txt as it was and says where the candidate is.
#
# Run it after changing requirements.txt or an extra, or to move to newer packages:
#     KEEP_PINS=1 tools/update-constraints.sh      # a new dependency, the others as they are
#     tools/update-constraints.sh                  # every package at the newest its range allows
# (arguments go to pytest, e.g. `-m "not slow"`; the file's header names the test command run)
# and commit constraints.txt with the change. It asks nothing (it runs unattended) and takes
# the time of an install and of the whole suite.
#
# Environment:
#   PYTHON          the interpreter the virtualenv is made from (default python3)
#   TORCH_SPEC      the torch requirement installed first (default torch==2.13.0, the README's)
#   TORCH_PIP_ARGS  extra pip arguments for that install, e.g. --index-url
#                   https://download.pytorch.org/whl/cpu where the default torch is a CUDA build
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
out=$repo/constraints.txt

work=$(mktemp -d "${TMPDIR:-/tmp}/bertcf-constraints.XXXXXX")
trap 'rm -rf "$work"' EXIT
candidate=$work/constraints.txt
if (($#)); then tests="python -m pytest -q $*"; else tests="python -m pytest -q"; fi

# The ranges, not the current pins: no constraints file from the environment either.
unset PIP_CONSTRAINT
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

echo "update-constraints: a fresh virtualenv in $work ($("$python" --version 2>&1))" >&2
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python

echo "update-constraints: pip install $torch_spec ${TORCH_PIP_ARGS:-}" >&2
# shellcheck disable=SC2086  # TORCH_PIP_ARGS is a list of arguments
"$venv_python" -m pip install -q "$torch_spec" ${TORCH_PIP_ARGS:-}
# The test extra and the optional ones (their tests run in CI too), so every package CI installs is pinned.
extras=test,search,mteb,mtl-solvers,references,peft
echo "update-constraints: pip install -e \"$repo[$extras]\"" >&2
if [[ ${KEEP_PINS:-} == 1 ]]; then keep=(-c "$out"); else keep=(); fi
"$venv_python" -m pip install -q -e "$repo[$extras]" "${keep[@]}"

# pip freeze, less: pip itself, this project, and the CUDA runtime wheels that a CUDA build of
# torch pins exactly (nvidia-*, triton), which follow the torch build installed first. A local
# version label (2.13.0+cpu) is dropped: torch==2.13.0 matches the CPU and the CUDA builds alike.
"$venv_python" -m pip freeze --all --exclude-editable > "$work/freeze.txt"
unpinned=$(grep -v -E '^[A-Za-z0-9._-]+==[^ ;]+$' "$work/freeze.txt" || true)
if [[ -n $unpinned ]]; then
  echo "update-constraints: pip freeze gave lines that are not name==version (a package installed" >&2
  echo "from a URL or a path?); constraints.txt is unchanged:" >&2
  echo "$unpinned" >&2
  exit 1
fi
pins=$(grep -v -i -E '^(pip|bertcf|triton|nvidia-[a-z0-9._-]+)==' "$work/freeze.txt" | sed -E 's/\+[A-Za-z0-9.]+$//' \
       | LC_ALL=C sort -f)

{
  echo "# The exact versions the test suite passes with (every package, transitive included); the"
  echo "# README's install command uses them:"
  echo "#     pip install torch==2.13.0 && pip install -e \".[test]\" -c constraints.txt"
  echo "# Made by tools/update-constraints.sh on $(date -u +%Y-%m-%d), $("$venv_python" --version 2>&1)," \
       "$(uname -s) $(uname -m):"
  echo "# a fresh virtualenv with $torch_spec, then the package and its extras ($extras) from the ranges of"
  echo "# requirements.txt and pyproject.toml ($([[ ${KEEP_PINS:-} == 1 ]] && echo "the earlier pins kept, new packages at" ||
    echo "at") the newest versions they allow), frozen, less pip,"
  echo "# this project, torch's CUDA wheels (nvidia-*, triton) and local version labels (+cpu)."
  echo "# Tests run on it, passed: $tests"
  echo "# Do not edit by hand: run tools/update-constraints.sh after changing requirements.txt or the"
  echo "# test extra, or to move to newer packages, and commit the result."
  echo "$pins"
} > "$candidate"

echo "update-constraints: $(echo "$pins" | wc -l) packages; running the test suite in the virtualenv" >&2
if ! (cd "$repo" && "$venv_python" -m pytest -q "$@"); then
  echo "update-constraints: the test suite failed on these versions; constraints.txt is unchanged" >&2
  kept=$(mktemp "${TMPDIR:-/tmp}/constraints.failed.XXXXXX")
  cp "$candidate" "$kept"
  echo "update-constraints: the candidate file is kept as $kept" >&2
  exit 1
fi
cp "$candidate" "$out.tmp" && mv "$out.tmp" "$out"
echo "update-constraints: wrote $out" >&2
