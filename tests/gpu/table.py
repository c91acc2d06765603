"""The GPU check's one table (markdown), from what tests/gpu/check.sh left in its work folder:

    python tests/gpu/table.py WORK > gpu_check.md

WORK holds ``env.txt`` (``key: value`` lines), ``steps.tsv`` (step, exit code, seconds),
``<step>.log`` for each step, the pytest steps' JUnit files ``<step>.xml`` and the benchmark's
``bench.json`` (bench/gpu_side_by_side.py --json).  A step that left no result file (killed by
its time limit, crashed) still gets its row, with its exit code and its log's last line.
Standard library only: it must run even where the wheels did not install.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

#: pytest steps: (step name in check.sh, what the row says it ran)
PYTEST_STEPS = (("test_cuda", "tests/test_cuda.py"), ("compat", "tests/gpu/test_compat_cuda.py"))


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " / ").strip()


def read_steps(work: Path) -> dict[str, tuple[int, int]]:
    steps = {}
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, rc, seconds = line.split("\t")
        steps[name] = (int(rc), int(seconds))
    return steps


def last_line(work: Path, step: str) -> str:
    path = work / f"{step}.log"
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.exists() else []
    return lines[-1][:200] if lines else "(no output)"


def how_it_ended(rc: int, seconds: int) -> str:
    return f"killed at its time limit ({seconds} s)" if rc in (124, 137) else f"exit {rc} after {seconds} s"


def junit(path: Path) -> list[tuple[str, str, str]]:
    """(test id, outcome, first lines of the failure message) of every test case."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        outcome, message = "pass", ""
        for tag, word in (("failure", "FAIL"), ("error", "ERROR"), ("skipped", "skip")):
            found = case.find(tag)
            if found is not None:
                text = found.get("message") or found.text or ""
                head = text.strip().split("\n\n")[0].splitlines()  # pytest.fail's heads end at a blank line
                outcome, message = word, " ".join(x.strip() for x in head[:4])[:400]
                break
        cases.append((name, outcome, message))
    return cases


def pytest_rows(work: Path, steps: dict[str, tuple[int, int]]) -> list[list[str]]:
    rows = []
    for step, target in PYTEST_STEPS:
        if step not in steps:
            continue
        rc, seconds = steps[step]
        xml = work / f"{step}.xml"
        if not xml.exists():
            ended = f"{how_it_ended(rc, seconds)}; log ends: {last_line(work, step)}"
            rows.append([target, "NO RESULT", ended, f"{seconds} s"])
            continue
        cases = junit(xml)
        counts = {word: sum(o == word for _, o, _ in cases) for word in ("pass", "FAIL", "ERROR", "skip")}
        bad = counts["FAIL"] + counts["ERROR"]
        result = "FAIL" if bad or rc not in (0, 5) else "skip" if not counts["pass"] else "pass"
        figures = (f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['ERROR']} errors, "
                   f"{counts['skip']} skipped")
        if rc in (124, 137):
            figures += f"; {how_it_ended(rc, seconds)}"
        rows.append([target, result, figures, f"{seconds} s"])
        for name, outcome, message in cases:
            # every case of the compat file (its rows are the matrix's rows); failures elsewhere
            if step == "compat" or outcome in ("FAIL", "ERROR"):
                rows.append([f"↳ {name}", outcome, message or "-", ""])
    return rows


def bench_rows(work: Path, steps: dict[str, tuple[int, int]]) -> list[list[str]]:
    if "bench" not in steps:
        return []
    rc, seconds = steps["bench"]
    path = work / "bench.json"
    if not path.exists():
        return [["bench/gpu_side_by_side.py", "NO RESULT",
                 f"{how_it_ended(rc, seconds)}; log ends: {last_line(work, 'bench')}", f"{seconds} s"]]
    result = json.loads(path.read_text())
    n = result["steps"]
    head = (f"{len(result['rounds'])} rounds x {n} steps ({result['warmup']} warm-up left out), "
            f"{result['device']}{' quick' if result['quick'] else ''}")
    rows = [["bench/gpu_side_by_side.py", "ran" if rc == 0 else how_it_ended(rc, seconds),
             head + (f"; {result['note']}" if result["note"] else ""), f"{seconds} s"]]
    for r in result["rows"]:
        parts = []
        if r["step_ms"] is not None:
            parts.append(f"median step {r['step_ms']:.2f} ms")
        if r["vs_base"] is not None and r["arm"] != "base":
            parts.append(f"x{r['vs_base']:.3f} vs unprofiled")
        if r["share_of_torch"] is not None:
            parts.append(f"overhead {r['share_of_torch']:.3f} of torch.profiler's")
        if r["wall_s"] is not None:
            parts.append(f"process wall {r['wall_s']:.1f} s")
        files = [f"{k} {v}" + ("" if k == "traces" else f"/{n}") for k, v in r["written"].items()]
        if files:
            parts.append("files: " + ", ".join(files))
        if r["error"]:
            parts.append(f"error: {r['error']}")
        ok = r["runs"].split("/")[0] == r["runs"].split("/")[1] and r["step_ms"] is not None
        rows.append([f"↳ {r['arm']}: {r['what']}", f"{r['runs']} runs ok" if ok else f"FAIL ({r['runs']} ok)",
                     "; ".join(parts), ""])
    return rows


def table(work: Path) -> str:
    steps = read_steps(work)
    env = work / "env.txt"
    rows = [["environment", "-", cell("; ".join(env.read_text().split("\n")).strip("; ")) if env.exists()
             else "-", ""]]
    if "install" in steps:
        rc, seconds = steps["install"]
        log = work / "install.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        stale = [x for x in lines if "STALE" in x]
        figures = f"{how_it_ended(rc, seconds)}; {last_line(work, 'install')}" if rc else \
            stale[0] if stale else "jobprof's wheel built from this tree's sources"
        rows.append(["install .whl/ (jobprof + missing deps)", "ok" if rc == 0 else "FAIL", figures,
                     f"{seconds} s"])
    rows += pytest_rows(work, steps) + bench_rows(work, steps)
    if "record" in steps:  # check.sh --record
        rc, seconds = steps["record"]
        result = "ok" if rc == 0 else how_it_ended(rc, seconds)
        rows.append(["tests/gpu/record.py (CUDA profiles for tests)", result, last_line(work, "record"),
                     f"{seconds} s"])
    lines = ["| check | result | figures | time |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
