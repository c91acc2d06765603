#!/usr/bin/env bash
# The GPU check (issue 28): one command on the lent GPU machine, one table, under 8 minutes.
#
#   there (repo root, .whl/ carried):  bash tests/gpu/check.sh
#   here, a CPU dry run:               PY=.venv/bin/python bash tests/gpu/check.sh --dry-run
#
# First run tests/gpu/prepare.sh here: it puts jobprof's wheel and the wheels the machine lacks
# in .whl/.  Then, each step under its own time limit and the next one run whatever happened:
#   install  the wheels into that python3's site-packages (jobprof's autoload .pth needs it there)
#   a+b      tests/test_cuda.py and tests/gpu/test_compat_cuda.py, side by side (correctness only)
#   c        bench/gpu_side_by_side.py alone on the machine (timings)
#   d        tests/gpu/table.py: the table, printed last and saved as $OUT/gpu_check.md, with the
#            logs in $OUT/logs.tar.gz ($OUT defaults to /tmp/gpu-check)
# --dry-run: no install (the current environment's jobprof), the pytest files skip without CUDA,
# the benchmark runs a tiny model on the CPU (--device cpu --quick).
set -uo pipefail  # no -e: a failed step is a row of the table, not the end of the check
cd "$(dirname "$0")/../.." || exit 1
DRY=0 RECORD=0
for arg in "$@"; do
    case $arg in
        --dry-run) DRY=1 ;;
        --record) RECORD=1 ;;  # also tests/gpu/record.py: CUDA profiles for tests here (~2 min, beside a+b)
        *) echo "usage: check.sh [--dry-run] [--record]" >&2; exit 2 ;;
    esac
done
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu-check}
WORK=$(mktemp -d /tmp/gpu-check-work.XXXXXX)  # logs and result files, tarred at the end
mkdir -p "$OUT"
# no network there: pip must not look for a newer pip; as root it would warn at every install
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
BEGAN=$SECONDS

say() { printf '[%s +%3ds] %s\n' "$(date +%T)" "$((SECONDS - BEGAN))" "$*"; }

# step NAME LIMIT_S CMD...: run CMD with its output in $WORK/NAME.log, killed at LIMIT_S;
# its exit code and seconds go to $WORK/steps.tsv for the table
step() {
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    say "$name: start (limit ${limit} s)"
    timeout -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >>"$WORK/steps.tsv"
    say "$name: exit $rc after $((SECONDS - start)) s; log ends: $(tail -n 1 "$WORK/$name.log")"
}

install() {
    ls .whl/jobprof-*.whl || { echo "no .whl/: run tests/gpu/prepare.sh first and carry .whl" >&2; return 1; }
    local pip=("$PY" -m pip install -q --no-index --no-cache-dir) here
    # jobprof and what the machine lacks; --no-deps: the rest is the machine's own
    "${pip[@]}" --no-deps .whl/*.whl || return 1
    # a wheel built from other sources than this tree's (prepare.sh not re-run after an edit) would
    # test old code: build jobprof here from the tree instead (setuptools is on that machine)
    here=$(find core plugins schemas setup.py pyproject.toml -type f ! -path '*/__pycache__/*' -print0 \
           | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
    if [ "$here" != "$(cat .whl/SOURCE 2>/dev/null)" ]; then
        echo "jobprof wheel is STALE (sources $(cat .whl/SOURCE 2>/dev/null), tree $here): installing the tree"
        "${pip[@]}" --no-deps --no-build-isolation --force-reinstall . || return 1
    fi
    # any requirement the machine's own packages do not meet comes from the fallbacks
    "${pip[@]}" --find-links .whl/fallback jobprof || return 1
    "$PY" - <<'EOF'
import pathlib, site, sys
import jobprof, jsonschema, orjson
from importlib import metadata
pth = [p for p in site.getsitepackages() if (pathlib.Path(p) / "jobprof-autoload.pth").exists()]
assert pth, "jobprof-autoload.pth is not in site-packages: PROFILING_MODE would do nothing"
print("jobprof", metadata.version("jobprof"), "at", jobprof.__file__, "autoload in", pth[0])
EOF
    "$PY" -m jobprof.cli.main plugins
}

environment() {  # key: value lines for the table's first row
    command -v nvidia-smi >/dev/null && echo "gpu: $(nvidia-smi -L | head -n 1)"
    "$PY" - <<'EOF'
import platform, torch
print(f"python: {platform.python_version()}")
cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"torch: {torch.__version__} (CUDA {torch.version.cuda}), {cuda}")
try:
    from importlib import metadata
    print(f"jobprof: {metadata.version('jobprof')}")
except Exception as exc:
    print(f"jobprof: not installed ({exc})")
EOF
}

say "GPU check in $PWD, python $(command -v "$PY"), work folder $WORK, results to $OUT"
[ "$DRY" = 1 ] && say "dry run: no install, tests skip without CUDA, bench --device cpu --quick"
export -f install && export PY  # timeout runs programs, not functions: a bash runs it
[ "$DRY" = 1 ] || step install 120 bash -c install
command -v nvidia-smi >/dev/null && nvidia-smi -L
environment | tee "$WORK/env.txt"

# a + b side by side: both check behaviour, not time, and the machine has 16 cores
PYTEST=("$PY" -m pytest -q -rA -p no:cacheprovider)
# pytest-timeout (there) fails one hung test and goes on; the step's limit is the backstop
"$PY" -c 'import pytest_timeout' 2>/dev/null && PYTEST+=(--timeout=130)
XDIST=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n 3)  # the three compat rows at once
step test_cuda 160 "${PYTEST[@]}" --junitxml="$WORK/test_cuda.xml" --basetemp="$WORK/tmp_cuda" \
    tests/test_cuda.py &
step compat 170 "${PYTEST[@]}" "${XDIST[@]}" --junitxml="$WORK/compat.xml" --basetemp="$WORK/tmp_compat" \
    tests/gpu/test_compat_cuda.py &
[ "$RECORD" = 1 ] && step record 200 "$PY" tests/gpu/record.py "$OUT" &
wait

# c: alone, so nothing else shares the GPU or the cores while it times
if [ "$DRY" = 1 ]; then BENCH=(--device cpu --quick --budget-s 150); else BENCH=(--budget-s 200); fi
step bench 240 "$PY" bench/gpu_side_by_side.py "${BENCH[@]}" --json "$WORK/bench.json"

# d: the table; the logs (not the profiles under tmp_*) into one tarball
"$PY" tests/gpu/table.py "$WORK" >"$OUT/gpu_check.md" 2>"$WORK/table.log" \
    || echo "table.py failed: $(tail -n 3 "$WORK/table.log")" >>"$OUT/gpu_check.md"
cp "$OUT/gpu_check.md" "$WORK/"
(cd "$WORK" && tar -czf "$OUT/logs.tar.gz" --exclude='tmp_*' .)
# what failed, in the console too (the device tool returns only the output's tail)
for name in test_cuda compat; do
    if grep -qE '^(FAILED|ERROR) ' "$WORK/$name.log" 2>/dev/null; then
        echo "--- $name: failures (whole log in logs.tar.gz)"
        grep -E '^(FAILED|ERROR) ' "$WORK/$name.log" | cut -c1-400 | head -n 12
    fi
done
say "done: $OUT/gpu_check.md, $OUT/logs.tar.gz ($(du -k "$OUT/logs.tar.gz" | cut -f1) KiB)"
rm -rf "$WORK"  # the profiles the tests wrote; what matters is in the tarball
echo
cat "$OUT/gpu_check.md"
