"""mstx: what a ``jobprof.mstx`` call costs, with profiling off and with msproftx recording.

    python bench/mstx.py [--calls N] [--repeats R] [--rounds K] [--json]

Both arms run the same measuring code in child processes of their own (scrubbed environment),
alternating off/on ``--rounds`` times:

- ``off``: no PROFILING_MODE, a plain ``from jobprof import mstx``: the no-op path every
  unprofiled run pays (target: under 1 us per call);
- ``on``: PROFILING_MODE=true with ``{"msproftx": "on", "mstx_domain_exclude": "skipped"}``; the
  child imports torch, so the real session starts and the msproftx plugin attaches its recorder
  (checked before timing).  The calls go through the public API and the real recorder.  The
  child never ends an iteration: between repeats, untimed, it drains the recorder with
  ``take()``, the hand-over the plugin does at each iteration end, so the queue stays small
  and nothing is written.

Each figure is ns per call (for the range rows: per range, start plus end), the median over
every round's repeats of (loop time - empty loop time) / calls (the minimum is shown too).
``record_function`` is torch's own ``with torch.profiler.record_function(...)``: off = torch's
cost, on = with jobprof's wrapper.
Nothing is asserted; the exit code is 0 unless a child fails (2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_snapshot, foreign_share  # bench/ is sys.path[0] when run as a script

CASES = ["mark", "range_start + range_end", "with range()", "push + pop", "domain mark",
         "domain mark (filtered out)", "@range decorated call", "record_function (torch)"]
ON_OPTIONS = {"msproftx": "on", "mstx_domain_exclude": "skipped"}


def _measure(calls: int, repeats: int) -> dict[str, list[float]]:
    """Runs in the child: ns per call of each case, one figure per repeat."""
    import torch

    from jobprof import mstx
    from jobprof.runtime import _state

    recorder = _state.SESSION.attached("msproftx") if _state.SESSION is not None else None
    drain = (lambda: recorder.take(1, 0, time.monotonic_ns())) if recorder is not None else (lambda: None)
    domain, skipped = mstx.domain("io"), mstx.domain("skipped")
    record_function = torch.profiler.record_function

    @mstx.range("decorated")
    def decorated() -> None:
        pass

    def plain() -> None:
        pass

    # explicit loops, one per case: the empty loop (or, for the decorator, the same loop
    # calling an undecorated function) is subtracted
    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def plain_calls(n: int) -> None:
        for _ in range(n):
            plain()

    def marks(n: int) -> None:
        for _ in range(n):
            mstx.mark("step")

    def start_end(n: int) -> None:
        for _ in range(n):
            mstx.range_end(mstx.range_start("step"))

    def with_range(n: int) -> None:
        for _ in range(n):
            with mstx.range("step"):
                pass

    def push_pop(n: int) -> None:
        for _ in range(n):
            mstx.push("step")
            mstx.pop()

    def domain_marks(n: int) -> None:
        for _ in range(n):
            domain.mark("step")

    def skipped_marks(n: int) -> None:
        for _ in range(n):
            skipped.mark("step")

    def decorated_calls(n: int) -> None:
        for _ in range(n):
            decorated()

    def record_functions(n: int) -> None:
        for _ in range(n):
            with record_function("step"):
                pass

    bodies = dict(zip(CASES, [marks, start_end, with_range, push_pop, domain_marks, skipped_marks,
                              decorated_calls, record_functions], strict=True))
    baselines = {name: plain_calls if name == "@range decorated call" else empty for name in CASES}
    out: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(repeats):
        for name, body in bodies.items():
            n = calls // 10 if name == "record_function (torch)" else calls  # ~100x slower
            drain()
            base = _time(baselines[name], n)
            took = _time(body, n)
            out[name].append(max(took - base, 0) / n)
    drain()
    out["_session"] = [float(recorder is not None)]
    return out


def _time(body, n: int) -> int:
    start = time.perf_counter_ns()
    body(n)
    return time.perf_counter_ns() - start


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFILING_", "JOBPROF_"))}
    env.update(extra)
    return env


def _arm(on: bool, calls: int, repeats: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="jobprof-mstx-") as tmp:
        extra = {}
        if on:
            extra = {"PROFILING_MODE": "true",
                     "PROFILING_OPTIONS": json.dumps({"output": tmp, "export": "inline", **ON_OPTIONS})}
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                               "--calls", str(calls), "--repeats", str(repeats)],
                              env=_child_env(extra), cwd=tmp, capture_output=True, text=True,
                              timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{'on' if on else 'off'} arm failed:\n{proc.stderr}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if bool(result.pop("_session")[0]) != on:
            raise RuntimeError(f"{'on' if on else 'off'} arm: the recorder was "
                               f"{'missing' if on else 'present'}")
        if any(Path(tmp).rglob("PROF_*")):
            raise RuntimeError("a run wrote a PROF_ directory; the child should end no iteration")
        return result


def run(calls: int = 20_000, repeats: int = 7, rounds: int = 3) -> dict:
    """``rounds`` alternating off/on child pairs; each case pools their repeats (a slow spell
    of this shared VM then lands on both arms rather than on one)."""
    before = cpu_snapshot()
    off: dict[str, list[float]] = {name: [] for name in CASES}
    on: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(rounds):
        for arm, pooled in ((False, off), (True, on)):
            for name, values in _arm(arm, calls, repeats).items():
                pooled[name] += values
    return {"calls": calls, "repeats": repeats, "rounds": rounds, "unit": "ns per call",
            "foreign_cpu_share": foreign_share(before, cpu_snapshot()),
            "cases": {name: {"off": statistics.median(off[name]), "on": statistics.median(on[name]),
                             "off_min": min(off[name]), "on_min": min(on[name]),
                             "off_all": off[name], "on_all": on[name]} for name in CASES}}


#: the no-op path every unprofiled run pays
OFF_TARGET_NS = 1000


def rows(result: dict) -> list[dict]:
    """bench/run.py table rows: off (target < 1 us) and on, per call."""
    out = []
    for name in CASES:
        case = result["cases"][name]
        gated = name != "record_function (torch)"  # torch's own cost is not ours to gate
        out.append({"benchmark": f"mstx {name} (ns per call)",
                    "baseline": f"off {case['off']:.0f} ns", "profiled": f"on {case['on']:.0f} ns",
                    "delta / ratio": f"+{case['on'] - case['off']:.0f} ns when on",
                    "spread": f"min off {case['off_min']:.0f} / on {case['on_min']:.0f}",
                    "target": f"off < {OFF_TARGET_NS} ns" if gated else "-",
                    "result": ("pass" if case["off"] < OFF_TARGET_NS else "FAIL") if gated else "info"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per case and child")
    parser.add_argument("--rounds", type=int, default=3, help="alternating off/on child pairs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.calls, args.repeats)))
        return 0
    try:
        result = run(args.calls, args.repeats, args.rounds)
    except RuntimeError as exc:
        print(f"bench mstx: harness failure: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    width = max(map(len, CASES))
    print(f"{'call':<{width}}  {'off ns':>8}  {'(min)':>6}  {'on ns':>8}  {'(min)':>6}")
    for name in CASES:
        case = result["cases"][name]
        print(f"{name:<{width}}  {case['off']:>8.0f}  {case['off_min']:>6.0f}  {case['on']:>8.0f}  "
              f"{case['on_min']:>6.0f}")
    print(f"- median of {args.rounds} x {args.repeats} loops of {args.calls} calls (record_function: "
          f"{args.calls // 10}), empty-loop time subtracted; off = profiling off (no-op path), "
          f"on = msproftx recording in a live session ({json.dumps(ON_OPTIONS)})")
    share = result["foreign_cpu_share"]
    if share is not None:
        print(f"- other processes used {share:.0%} of the machine's CPU time meanwhile"
              f"{' (figures are rough)' if share > 0.10 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
