#!/usr/bin/env bash
# Prepare the GPU check (tests/gpu/check.sh) HERE, on a machine with network access:
#
#     bash tests/gpu/prepare.sh
#
# The GPU machine has no network and no jobprof; its python3 (3.12, x86_64) has torch, pytest,
# pluggy, attrs, tabulate, tqdm but not jsonschema (+ its three deps) or orjson.  So this builds
# jobprof's wheel from the working tree and downloads the missing wheels into .whl/ at the repo
# root (ignored through .git/info/exclude, so the device tool must be told to carry it).
#
#   .whl/*.whl           installed there with --no-deps: jobprof + what the machine lacks
#   .whl/fallback/*.whl  pure-Python deps the machine already has; used only if its copy is
#                        missing or too old (pip picks them from --find-links, see check.sh)
#
# Versions are those of the local venv (.venv, what CI tests) when it has them.
# The jobprof wheel is a snapshot of core/ and plugins/: run this again right before each device
# run (check.sh rebuilds jobprof there from the tree it got when .whl/SOURCE says the wheel is stale).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

# the GPU machine's interpreter: CPython 3.12 on x86_64 glibc
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform any)
MISSING=(jsonschema jsonschema-specifications referencing rpds-py orjson)
FALLBACK=(attrs pluggy tabulate tqdm typing_extensions)

grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl/fallback

pinned() {  # NAME==VERSION as installed in $PY, else NAME (the newest)
    "$PY" - "$@" <<'EOF'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        print(name)
EOF
}

echo "== jobprof wheel (from the working tree)"
# pip wheel builds in an isolated env (setuptools from the index) like `python -m build`
"$PY" -m pip wheel -q --no-deps -w .whl .
rm -rf build  # setuptools' staging folder (ignored, but no need to leave it)
# what the wheel was built from: check.sh compares it with the tree it runs in (the same line)
find core plugins schemas setup.py pyproject.toml -type f ! -path '*/__pycache__/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16 >.whl/SOURCE
echo "   sources $(cat .whl/SOURCE)"

echo "== wheels the GPU machine lacks"
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d .whl $(pinned "${MISSING[@]}")
echo "== fallbacks for deps it has (installed there only when its own copy does not satisfy)"
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d .whl/fallback $(pinned "${FALLBACK[@]}")

echo "== what each wheel requires (besides extras); each must be in .whl/, in .whl/fallback/ or on the machine"
for whl in .whl/*.whl .whl/fallback/*.whl; do
    reqs=$(unzip -p "$whl" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
           | sed 's/^Requires-Dist: //' | paste -sd ';' - || true)
    printf '  %-60s %s\n' "$(basename "$whl")" "${reqs:--}"
done

# one version of each distribution, or pip refuses the whole install
dups=$(find .whl -name '*.whl' -printf '%f\n' | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dups" ] || { echo "more than one wheel of: $dups" >&2; exit 1; }
ls .whl/jobprof-*.whl >/dev/null

total=$(du -sk .whl | cut -f1)
echo "== .whl/: $(find .whl -name '*.whl' | wc -l) wheels, ${total} KiB"
[ "$total" -lt 20480 ] || { echo ".whl/ is over 20 MB" >&2; exit 1; }
ls -l .whl .whl/fallback
