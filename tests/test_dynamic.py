"""Dynamic mode on real jobs: ``PROFILING_MODE=dynamic``, captures asked with ``jobprof start``
while the job runs (one process; four ranks under torchrun), captures a trigger asks for by
itself (a slow iteration; a straggling rank), a stranger's request, a job killed mid-capture.

The job is ``programs/dynamic_job.py``: it trains until the test creates its stop file, then
prints each rank's step count and the exact sum of its losses; a second, unprofiled run of
that many steps must print the same sum (profiling changed nothing but time)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, clean_env, free_port, jobprof_cli, read_csv

JOB = REPO / "tests" / "programs" / "dynamic_job.py"
pytestmark = pytest.mark.slow


class Job:
    """A dynamic_job.py run in the background (alone, or under torchrun with ``ranks``)."""

    def __init__(self, tmp: Path, options: dict[str, Any] | None, ranks: int = 1, **env: Any) -> None:
        self.tmp, self.out, self.stop_file = tmp, tmp / "prof", tmp / "stop"
        extra = {f"DYN_{k.upper()}": str(v) for k, v in env.items()}
        if options is not None:
            extra["PROFILING_MODE"] = "dynamic"
            extra["PROFILING_OPTIONS"] = json.dumps({"output": str(self.out), **options})
        extra.setdefault("DYN_STOP", str(self.stop_file))
        cmd = [sys.executable, str(JOB)]
        if ranks > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={ranks}",
                   "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(JOB)]
        self.proc = subprocess.Popen(cmd, cwd=tmp, env=clean_env(OMP_NUM_THREADS="1", **extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def status(self) -> list[dict[str, Any]]:
        done = jobprof_cli("status", "--json", "--job", str(self.out))
        return json.loads(done.stdout)["ranks"] if done.returncode == 0 else []

    def wait_for(self, iteration: int, ranks: int = 1, timeout: float = 120) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.finish()
            states = self.status()
            if len(states) == ranks and all(s["iteration"] >= iteration and s["rate"] for s in states):
                return states
            time.sleep(0.3)
        raise AssertionError(f"the job did not reach iteration {iteration}: {self.status()}")

    def start(self, *args: str) -> subprocess.CompletedProcess:
        return jobprof_cli("start", "--job", str(self.out), *args, timeout=300)

    def finish(self, timeout: float = 120) -> str:
        self.stop_file.touch()
        out, err = self.proc.communicate(timeout=timeout)
        self.stderr = err
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}\n{out}\n{err[-4000:]}"
        return out


def losses(stdout: str) -> dict[str, tuple[int, str]]:
    """{rank: (steps, repr of the loss sum)} from the job's last lines."""
    # torchrun interleaves the ranks' output: lines may run into each other
    found = re.finditer(r"rank (\d+) steps (\d+) loss-sum ([0-9.eE+-]+)", stdout)
    return {m[1]: (int(m[2]), m[3]) for m in found}


def unprofiled_same(tmp: Path, profiled: str, ranks: int = 1, **env: Any) -> None:
    """The same job without jobprof, for as many steps: the same losses, bit for bit."""
    seen = losses(profiled)
    steps = {s for s, _ in seen.values()}
    assert len(seen) == ranks and len(steps) == 1, profiled
    base = tmp / "unprofiled"
    base.mkdir()
    job = Job(base, None, ranks, max=steps.pop(), **env)
    out, err = job.proc.communicate(timeout=300)
    assert job.proc.returncode == 0, err[-3000:]
    assert losses(out) == seen, (out, profiled)


def captures(out: Path, job_dir: Path | None = None) -> list[Path]:
    return [p for p in sorted(out.glob("PROF_*")) if not (p / "control").is_dir()]


def capture_info(folder: Path, device: int = 0) -> dict[str, Any]:
    info = json.loads((folder / f"device_{device}" / f"info.json.{device}").read_text())["jobprof"]
    return info


def iterations_of(folder: Path, device: int = 0) -> list[int]:
    from jobprof.analysis.profile import Profile

    return [it.index for it in Profile(folder).iterations(device)]


def files(folder: Path, name: str, device: int = 0) -> list[Path]:
    return sorted((folder / f"device_{device}" / "summary").glob(f"{name}_*.csv"))


# -- one process ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """One process: capture 1 (operator tier, 10 iterations, asked while it ran), a request
    planted by another uid (refused), capture 3 (other options), capture 4 (stopped early)
    and a start refused while capture 4 ran."""
    if os.geteuid() != 0:
        pytest.skip("a request planted by uid 65534 and a command run as that uid need root "
                    "(CI runs as root)")
    tmp = tmp_path_factory.mktemp("alone")
    job = Job(tmp, {"training_trace": "on", "task_trace": "on", "export": "inline"}, sleep_ms=5)
    result: dict[str, Any] = {"job": job}
    try:
        job.wait_for(30)
        result["first"] = job.start("--iterations", "10", "--wait")
        folder = next(job.out.glob("PROF_*/control"))
        planted = folder / "start_000002.json"
        planted.write_text(json.dumps({"id": 2, "at": 1, "iterations": 1000000, "options": {},
                                       "prof_dir": "PROF_000099_20260101000000000_AAAAAAAAAAAAAAAA",
                                       "trigger": "manual", "created": time.time()}))
        planted.chmod(0o600)
        os.chown(planted, 65534, 65534)
        time.sleep(0.5)
        result["second"] = job.start("--iterations", "5", "--options",
                                     '{"task_trace": "off", "task_memory": "on"}', "--wait")
        result["long"] = job.start("--iterations", "100000")
        time.sleep(0.3)
        result["refused"] = job.start("--iterations", "5")
        job.wait_for(job.status()[0]["iteration"] + 20)
        result["stop"] = jobprof_cli("stop", "--job", str(job.out))
        time.sleep(1.5)
        result["status"] = jobprof_cli("status", "--job", str(job.out))
        result["stranger"] = as_nobody(["start", "--job", str(job.out)])
        result["by_pid"] = jobprof_cli("status", "--json", "--pid", str(job.proc.pid))
        result["stdout"] = job.finish()
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    return result


def as_nobody(argv: list[str]) -> tuple[int, str]:
    """``jobprof <argv>`` run by uid 65534 (a forked child of this root test: that uid cannot
    execute this venv's scripts); its exit status and stderr."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, run the command in-process
        code = 70
        try:
            os.close(read)
            os.dup2(write, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 (pytest's capture object, else)
            from jobprof.cli.main import commands, main

            commands()  # imported before: nobody cannot read this checkout (nor, in CI, the stdlib)

            os.setgid(65534)
            os.setuid(65534)
            code = main(argv)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as handle:
        text = handle.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text


def test_a_capture_covers_the_asked_iterations_with_the_operator_tier(alone):
    assert alone["first"].returncode == 0, alone["first"].stderr
    job_dir = next(alone["job"].out.glob("PROF_*/control")).parent
    first = captures(alone["job"].out)[0]
    info = capture_info(first)
    asked = info["capture"]["asked"]
    its = iterations_of(first)
    assert its == list(range(asked[0], asked[0] + 10)), (its, info["capture"])
    assert asked[0] > 30 and info["capture"]["trigger"] == "manual" and info["end_reason"] == "capture end"
    assert info["capture"]["job"] == job_dir.name
    assert len(files(first, "op_summary")) == 10 and len(files(first, "step_trace")) == 10
    # the run's real iteration numbers in the files
    rows = read_csv(files(first, "step_trace")[0])
    assert int(rows[0]["Iteration ID"]) == its[0]
    # the job's own folder: the step tier for every iteration, no operator
    job_its = iterations_of(job_dir)
    assert job_its == list(range(1, len(job_its) + 1)) and len(job_its) > its[-1]
    assert not files(job_dir, "op_summary")


def test_a_second_capture_takes_other_options(alone):
    assert alone["second"].returncode == 0, alone["second"].stderr
    second = next(c for c in captures(alone["job"].out) if capture_info(c)["capture"]["options"])
    info = capture_info(second)
    assert info["capture"]["options"] == {"task_trace": "off", "task_memory": "on"}
    assert len(iterations_of(second)) == 5
    assert len(files(second, "memory_record")) == 5 and not files(second, "op_summary")
    assert "task_memory" in info["plugins"] and "task_trace" not in info["plugins"]


def test_a_start_while_a_capture_runs_is_refused_and_stop_ends_it(alone):
    assert alone["long"].returncode == 0, alone["long"].stderr
    refused = alone["refused"]
    assert refused.returncode == 3 and "refused: capture 4 is running" in refused.stderr, refused.stderr
    assert alone["stop"].returncode == 0, alone["stop"].stderr
    stopped = [c for c in captures(alone["job"].out) if capture_info(c)["capture"]["asked"][1] > 99999]
    assert len(stopped) == 1
    info = capture_info(stopped[0])
    its = iterations_of(stopped[0])
    assert 20 <= len(its) < 1000 and info["capture"]["last"] == its[-1], (len(its), info["capture"])
    assert "jobprof stop" in info["capture"]["stopped_by"]


def test_a_request_from_another_uid_is_refused_and_named(alone):
    names = {capture_info(c)["capture"]["id"] for c in captures(alone["job"].out)}
    assert 2 not in names and len(names) == 3, names
    assert "start_000002.json refused" in alone["job"].stderr and "uid 65534" in alone["job"].stderr
    assert "start_000002.json refused" in alone["status"].stdout  # jobprof status shows it too


def test_a_stranger_cannot_start_a_capture(alone):
    code, stderr = alone["stranger"]
    assert code == 2 and "only the job's user" in stderr, (code, stderr)


def test_status_finds_the_job_of_a_process(alone):
    done = alone["by_pid"]
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert [r["pid"] for r in found["ranks"]] == [alone["job"].proc.pid], found
    assert Path(found["job"]).parent == alone["job"].out
    gone = jobprof_cli("status", "--pid", str(alone["job"].proc.pid))  # the job has ended
    assert gone.returncode == 2 and "no process" in gone.stderr, gone.stderr


def test_the_summary_lists_the_captures_and_each_says_why(alone):
    out = alone["job"].out
    job_dir = next(out.glob("PROF_*/control")).parent
    model = json.loads(jobprof_cli("summary", "--json", str(job_dir)).stdout)
    listed = model["sections"]["captures"]["rows"]
    assert [row[0] for row in listed] == [1, 3, 4], listed
    first = captures(out)[0]
    model = json.loads(jobprof_cli("summary", "--json", str(first)).stdout)
    row = model["sections"]["capture"]["rows"][0]
    assert row[1] == "manual" and "jobprof start" in row[5], row


def test_the_commands_read_a_capture_unchanged(alone, tmp_path):
    first, second = captures(alone["job"].out)[:2]
    for args in (["report", str(first), "-o", str(tmp_path / "r.html")],
                 ["diff", str(first), str(second)],
                 ["merge", str(first), "-o", str(tmp_path / "merged")]):
        done = jobprof_cli(*args)
        assert done.returncode in (0, 1) and "error" not in done.stderr.lower(), (args, done.stderr)
    assert (tmp_path / "r.html").stat().st_size > 1000


def test_a_start_needs_a_running_job(alone, tmp_path):
    done = jobprof_cli("start", "--job", str(alone["job"].out))
    assert done.returncode == 2 and "no job in dynamic mode is running" in done.stderr, done.stderr
    done = jobprof_cli("start", "--job", str(tmp_path))
    assert done.returncode == 2 and "no job in dynamic mode" in done.stderr, done.stderr


# -- four ranks ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ranks4(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks4")
    job = Job(tmp, {"training_trace": "on", "task_trace": "on", "export": "inline"}, ranks=4, sleep_ms=10,
              ddp=1)
    try:
        job.wait_for(20, ranks=4, timeout=240)
        first = job.start("--iterations", "10", "--wait")
        second = job.start("--iterations", "5", "--options", '{"task_trace": "off", "hccl": "on"}', "--wait")
        stdout = job.finish()
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    return {"job": job, "first": first, "second": second, "stdout": stdout, "tmp": tmp}


def test_every_rank_captures_the_same_iterations(ranks4):
    assert ranks4["first"].returncode == 0 and ranks4["second"].returncode == 0, \
        (ranks4["first"].stderr, ranks4["second"].stderr)
    first, second = captures(ranks4["job"].out)
    for folder, count in ((first, 10), (second, 5)):
        seen = {d: iterations_of(folder, d) for d in range(4)}
        asked = capture_info(folder)["capture"]["asked"]
        assert all(v == list(range(asked[0], asked[0] + count)) for v in seen.values()), (folder.name, seen)
        ranks = sorted(json.loads((folder / f"device_{d}" / f"info.json.{d}").read_text())["rank_id"]
                       for d in range(4))
        assert ranks == [0, 1, 2, 3]
    assert all(len(files(first, "op_summary", d)) == 10 for d in range(4))
    assert all(len(files(second, "communication_statistic", d)) == 5 and not files(second, "op_summary", d)
               for d in range(4))
    # DDP's bucket all-reduces, made by a reducer built before the capture began, are captured
    ops = {row["OP Type"] for f in files(second, "communication_statistic") for row in read_csv(f)}
    assert any("all_reduce" in op or "allreduce" in op.lower() for op in ops), ops
    latency = [capture_info(first, d)["capture"]["latency_s"] for d in range(4)]
    print(f"start latency per rank (s): {latency}")
    assert all(0 < x < 10 for x in latency), latency


def test_four_ranks_profiled_dynamically_train_as_unprofiled(ranks4):
    unprofiled_same(ranks4["tmp"], ranks4["stdout"], ranks=4, sleep_ms=0, ddp=1)


# -- two starts at once --------------------------------------------------------------------------
def race(job: Job, *args: str) -> list[subprocess.CompletedProcess]:
    """Two ``jobprof start`` commands run at the same moment against ``job``."""
    cmd = [str(Path(sys.executable).with_name("jobprof")), "start", "--job", str(job.out), *args]
    procs = [subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    return done


def one_won(done: list[subprocess.CompletedProcess]) -> tuple[int, Path, dict[str, tuple[int, int]], range]:
    """Exactly one of two racing starts captured (exit 0) and the other was refused (exit 3),
    naming the running capture and no folder; no line says 'not captured'.  The winner's
    capture number, its folder, its per-process lines {who: (first, last)} and the asked range."""
    said = [(d.returncode, d.stdout, d.stderr) for d in done]
    assert sorted(d.returncode for d in done) == [0, 3], said
    won, lost = sorted(done, key=lambda d: d.returncode)
    assert all("not captured" not in d.stdout + d.stderr for d in done), said
    head = re.search(r"^capture (\d+): iterations (\d+)-(\d+) of PROF_\S+ \((\d+) of (\d+) process\(es\)\) "
                     r"into (\S+)$", won.stdout, re.M)
    assert head and head[4] == head[5], said
    number, folder = int(head[1]), Path(head[6])
    assert f"refused: capture {number} is running" in lost.stderr, said
    assert lost.stdout == "" and "PROF_" not in lost.stderr, said  # no folder that will not exist
    lines = {m[1]: (int(m[2]), int(m[3]))
             for m in re.finditer(r"^  (rank \d+|process \d+): iterations (\d+)-(\d+)(?: \(.*\))?$",
                                  won.stdout, re.M)}
    return number, folder, lines, range(int(head[2]), int(head[3]) + 1)


def idle_after(job: Job, number: int, ranks: int = 1, timeout: float = 60) -> None:
    """Until every process has finished capture ``number`` (``jobprof start`` without --wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = job.status()
        if len(states) == ranks and all(
                any(c["id"] == number and c["state"] == "finished" for c in s["captures"])
                and not s["finishing"] for s in states):
            return
        time.sleep(0.2)
    raise AssertionError(f"capture {number} did not finish: {job.status()}")


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "no-wait"])
def test_of_two_starts_at_once_one_captures_and_the_other_is_refused(tmp_path, wait):
    # 20 iterations of ~11 ms: the capture outlasts the two commands' start-up jitter (a start
    # that comes after the capture has ended may capture too, rightly)
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "inline"}, sleep_ms=10)
    try:
        job.wait_for(5)
        for _ in range(3 if wait else 2):
            before = set(captures(job.out))
            number, folder, lines, asked = one_won(race(job, "--iterations", "20", *(["--wait"] * wait)))
            if not wait:
                assert not lines
                idle_after(job, number)
            assert set(captures(job.out)) - before == {folder}  # the refused one made none
            its = iterations_of(folder)
            if wait:  # the captured iterations, as the job's line said
                [(first, last)] = lines.values()
                assert its == list(range(first, last + 1)) and len(its) == 20, (its, lines)
            else:  # from the asked first iteration (or a little later: the job's note says so)
                assert len(its) == 20 and its[0] >= asked[0], (its, asked)
            assert capture_info(folder)["capture"]["id"] == number
    finally:
        job.proc.kill()
        job.proc.communicate()


def test_of_two_starts_at_once_on_two_ranks_each_rank_says_what_it_captured(tmp_path):
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "inline"}, ranks=2,
              sleep_ms=10)
    try:
        job.wait_for(5, ranks=2)
        number, folder, lines, asked = one_won(race(job, "--iterations", "20", "--wait"))
        assert sorted(lines) == ["rank 0", "rank 1"] and set(lines.values()) == {(asked[0], asked[-1])}, lines
        assert [iterations_of(folder, d) for d in range(2)] == [list(asked)] * 2
        number, folder, lines, asked = one_won(race(job, "--iterations", "20"))  # no --wait: acknowledged
        idle_after(job, number, ranks=2)
        assert [iterations_of(folder, d) for d in range(2)] == [list(asked)] * 2
    finally:
        job.proc.terminate()  # torchrun ends its ranks
        job.proc.communicate()


def test_a_start_that_waits_says_so_when_the_job_is_killed_during_its_capture(tmp_path):
    """Before: `jobprof start --wait` on a job SIGKILLed mid-capture waited for an hour."""
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "inline"}, sleep_ms=10)
    try:
        job.wait_for(5)
        cmd = [str(Path(sys.executable).with_name("jobprof")), "start", "--job", str(job.out),
               "--iterations", "100000", "--wait"]
        start = subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.monotonic() + 60
        while not any(s.get("capture") for s in job.status()):
            assert time.monotonic() < deadline and start.poll() is None, start.communicate()
            time.sleep(0.1)
        job.proc.kill()
        job.proc.communicate()
        out, err = start.communicate(timeout=30)  # not an hour
        assert start.returncode == 1, (out, err)
        assert f"(pid {job.proc.pid}) died during the capture" in out, (out, err)
        assert "`jobprof export` renders what it wrote" in out
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.communicate()


# -- triggers ------------------------------------------------------------------------------------
def test_a_slow_iteration_triggers_one_capture_of_the_next_iterations(tmp_path):
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "inline",
                         "trigger": {"slow_iteration": 3, "iterations": 10}},
              sleep_ms=10, spike=80, max=160, stop="")
    out, err = job.proc.communicate(timeout=300)
    assert job.proc.returncode == 0, err[-3000:]
    found = captures(job.out)
    assert len(found) == 1, (found, err)
    info = capture_info(found[0])["capture"]
    # the job sleeps after its 80th optimizer step: in jobprof's iteration 81 (iterations end
    # at the optimizer step)
    assert info["trigger"] == "slow_iteration" and "iteration 81 took" in info["reason"], info
    its = iterations_of(found[0])
    assert its == list(range(82, 92)), (its, info)
    assert len(files(found[0], "op_summary")) == 10
    unprofiled_same(tmp_path, out, sleep_ms=0, spike=0)


def test_a_straggling_rank_triggers_one_capture_on_every_rank(tmp_path):
    # rank 3 sleeps 40 ms more per iteration from iteration 60 (about +400% on ~10 ms): the
    # threshold, 150%, leaves room both ways: a CI run saw a loaded rank (4 ranks on 2 cores beside
    # another test worker) at +83% with no straggler
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "inline",
                         "trigger": {"rank_outlier": 150, "iterations": 10}},
              ranks=4, sleep_ms=10, sync=10, slow_rank=3, slow_ms=40, slow_from=60, max=300, stop="")
    _, err = job.proc.communicate(timeout=400)
    assert job.proc.returncode == 0, err[-3000:]
    found = captures(job.out)
    assert len(found) == 1, (found, err[-3000:])
    info = capture_info(found[0])["capture"]
    assert info["trigger"] == "rank_outlier" and info["reason"].startswith("rank 3's"), info
    seen = {d: iterations_of(found[0], d) for d in range(4)}
    assert len({tuple(v) for v in seen.values()}) == 1 and len(seen[0]) == 10, seen
    assert seen[0][0] > 60, seen


def test_memory_growing_for_m_iterations_triggers_one_capture(tmp_path):
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "task_memory": "on", "export": "inline",
                         "trigger": {"memory_growth": 10, "iterations": 5}},
              sleep_ms=5, leak_from=60, max=120, stop="")
    out, err = job.proc.communicate(timeout=300)
    assert job.proc.returncode == 0, err[-3000:]
    found = captures(job.out)
    assert len(found) == 1, (found, err)
    info = capture_info(found[0])["capture"]
    assert info["trigger"] == "memory_growth" and "10 iteration ends in a row" in info["reason"], info
    its = iterations_of(found[0])
    # the leak starts in iteration 60 (kept after its loss, before its optimizer step ends it
    # in the next, 61): 10 growths in a row end at iteration 70 at the earliest
    assert len(its) == 5 and 71 <= its[0] <= 76, (its, info)
    assert len(files(found[0], "operator_memory")) == 5
    unprofiled_same(tmp_path, out, sleep_ms=0)


# -- a job killed during a capture --------------------------------------------------------------
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_job_killed_during_a_capture_leaves_exportable_raw_data(tmp_path, how):
    job = Job(tmp_path, {"training_trace": "on", "task_trace": "on", "export": "off"}, sleep_ms=5)
    try:
        job.wait_for(20)
        assert job.start("--iterations", "100000").returncode == 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found, status = captures(job.out), job.status()[0]
            if found and (status.get("capture") or {}).get("first", 10**9) + 5 < status["iteration"]:
                break
            time.sleep(0.2)
        killed = time.monotonic()
        job.proc.send_signal(how)
        job.proc.communicate(timeout=60)
        ended = time.monotonic()
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    [capture] = captures(job.out)
    assert job.proc.returncode == -how  # it died of the signal, as unprofiled
    if how == signal.SIGTERM:  # the capture ends with the job: promptly, and says so
        assert ended - killed < 5, ended - killed
        info = capture_info(capture)
        assert info["end_reason"] == "SIGTERM" and "ended with the job (SIGTERM)" in info["capture"]["note"]
    done = jobprof_cli("export", str(capture))
    assert done.returncode == 0, done.stderr
    steps, ops = files(capture, "step_trace"), files(capture, "op_summary")
    assert len(steps) >= 3 and len(ops) == len(steps), (len(steps), len(ops))


# -- the pieces ----------------------------------------------------------------------------------
def test_the_agreed_iteration_leaves_every_rank_time_to_see_the_request():
    from jobprof.files import control

    now = time.time()
    states = [{"iteration": 100, "rate": 50.0, "time": now - 0.2},
              {"iteration": 98, "rate": 40.0, "time": now},
              {"iteration": 500, "rate": 50.0, "time": now - 3600}]  # gone: left out
    # the furthest rank projected to now (110), 0.4 s at the fastest rate (20), 3 more
    assert control.agreed_iteration(states, now) == 110 + 20 + 3
    assert control.agreed_iteration(states[2:], now) is None


def test_a_request_file_is_trusted_only_as_the_job_wrote_it(tmp_path):
    from jobprof.files import control

    folder = tmp_path / "PROF_000001_20260101000000000_AAAAAAAAAAAAAAAA"
    folder.mkdir()
    made = control.make(folder)
    assert oct(made.stat().st_mode & 0o777) == "0o700"
    assert control.publish(made, "start_000001.json", {"id": 1}, exclusive=True)
    assert not control.publish(made, "start_000001.json", {"id": 2}, exclusive=True)  # first one wins
    assert control.read_trusted(made / "start_000001.json") == {"id": 1}
    (made / "start_000002.json").symlink_to(made / "start_000001.json")
    with pytest.raises(control.Untrusted, match="symbolic link"):
        control.read_trusted(made / "start_000002.json")
    loose = made / "start_000003.json"
    loose.write_text("{}")
    loose.chmod(0o666)
    with pytest.raises(control.Untrusted, match="writable by other users"):
        control.read_trusted(loose)
    made.chmod(0o755)
    with pytest.raises(control.Untrusted, match="open to other users"):
        control.check_folder(made)
    with pytest.raises(ValueError, match="positive"):
        control.Request.from_json({"id": 1, "at": 0, "iterations": 5, "prof_dir": "x"})


FILE_WORK = """
import json, threading, time, torch
from collections import Counter
from jobprof.files import control
seen = Counter()
for name in ("entries", "publish"):
    def counted(*args, _original=getattr(control, name), _name=name, **kwargs):
        seen[_name, threading.current_thread().name] += 1
        return _original(*args, **kwargs)
    setattr(control, name, counted)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
end = time.monotonic() + 2.0
while time.monotonic() < end:
    opt.zero_grad(); model(torch.ones(2, 4)).sum().backward(); opt.step(); time.sleep(0.005)
print(json.dumps({f"{k[0]} {k[1]}": v for k, v in seen.items()}))
"""


def test_the_training_thread_leaves_the_control_folder_to_its_own_thread(tmp_path):
    # issue 48: listing the folder every 0.1 s and writing the status every second cost 0.4-0.7
    # ms of a 37 ms step on the training thread; they run on the controller's own thread now,
    # and the training thread reads the folder only when a request waits there
    (tmp_path / "job.py").write_text(FILE_WORK)
    env = clean_env(PROFILING_MODE="dynamic", OMP_NUM_THREADS="1",
                    PROFILING_OPTIONS=json.dumps({"output": str(tmp_path / "prof"), "training_trace": "on"}))
    done = subprocess.run([sys.executable, str(tmp_path / "job.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # MainThread: the first poll (it makes the folder); jobprof-control: ~20 listings in 2 s
    assert seen.get("entries MainThread", 0) <= 1 and seen.get("entries jobprof-control", 0) >= 10, seen
    # the statuses while it trains are that thread's (the last one, as the job ends, is not)
    assert seen.get("publish jobprof-control", 0) >= 1 and seen.get("publish MainThread", 0) <= 1, seen
    states = json.loads(jobprof_cli("status", "--json", "--job", str(tmp_path / "prof")).stdout)["ranks"]
    assert len(states) == 1 and states[0]["ended"] == "exit" and states[0]["iteration"] > 50, states
