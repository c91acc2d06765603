"""``jobprof start`` / ``stop`` / ``status``: control a job that runs in dynamic mode
(``PROFILING_MODE=dynamic``) through its control folder (:mod:`jobprof.files.control`)."""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from tabulate import tabulate

from jobprof.cli._common import new_manager, printable
from jobprof.files import control, profdir
from jobprof.files.control import Untrusted

#: iterations a capture covers when neither --iterations nor --seconds is given
DEFAULT_ITERATIONS = 10
#: exit statuses of ``jobprof start`` (docs/cli.md): 0 every process captured (with --wait) or
#: accepted the capture (without)
NO_ANSWER = 1  # no answer from some process in time (or, with --wait, no end): the request stands
CANNOT = 2  # argparse's usage errors, and a capture that could not be asked for (nothing written)
REFUSED = 3  # refused (a capture is running, or the job refused it): nothing is captured
PARTIAL = 4  # some processes captured (or accepted), others refused: the folder lacks them
#: without --wait, how long ``start`` waits for every process to answer its request: three of the
#: slowest process's iterations (requests are read at iteration ends), within these bounds (s)
ANSWER_S = (5.0, 60.0)
#: the states of a process's answer in which the capture still runs or is about to
UNDERWAY = ("pending", "running", "writing")


class Refused(Exception):
    """The command cannot do what was asked (message: why, and what to do)."""


class Busy(Refused):
    """Refused because a capture is running (or being written): exit :data:`REFUSED`."""


@attrs.frozen
class Answer:
    """What one process of the job says about start request ``N`` (its status file)."""

    #: waiting (not read yet), pending, running, writing, captured, refused, cancelled, ended,
    #: unknown (read, but its answer has left the status), gone (no status any more)
    state: str
    #: the process's outcome line, after its name
    text: str


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("start", help="capture the next iterations of a job in dynamic mode "
                                     "(PROFILING_MODE=dynamic), every rank the same ones")
    _add_target(p)
    p.add_argument("--options", metavar="JSON", help="PROFILING_OPTIONS keys laid over the job's own "
                                                     "for this capture, e.g. '{\"task_memory\": \"on\"}'")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--iterations", type=_positive, metavar="N",
                        help=f"iterations to capture (default {DEFAULT_ITERATIONS})")
    length.add_argument("--seconds", type=float, metavar="S",
                        help="about S seconds of iterations, at the job's current iteration rate")
    p.add_argument("--at", type=_positive, metavar="ITERATION",
                   help="the first iteration to capture (default: the earliest every rank can still make)")
    p.add_argument("--wait", action="store_true", help="return when every rank has finished the capture")
    p.set_defaults(func=run_start)
    p = sub.add_parser("stop", help="end the capture running in a job in dynamic mode (at the next "
                                    "iteration boundary every rank can make)")
    _add_target(p)
    p.add_argument("--at", type=_positive, metavar="ITERATION", help="the first iteration not captured")
    p.set_defaults(func=run_stop)
    p = sub.add_parser("status", help="jobs in dynamic mode: ranks, current iteration, captures")
    _add_target(p)
    p.add_argument("--json", action="store_true", help="print what the ranks report as JSON")
    p.set_defaults(func=run_status)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_target(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group()
    target.add_argument("--job", type=Path, metavar="DIR",
                        help="the job's PROF_ folder, or its output folder (default: the output of "
                             "$PROFILING_OPTIONS, else the current folder)")
    target.add_argument("--pid", type=int, help="a process of the job (a rank or its launcher), on this host")


# -- finding the job ---------------------------------------------------------------------------
def _default_output() -> Path:
    try:
        given = json.loads(os.environ.get("PROFILING_OPTIONS") or "{}")
        return Path(given.get("output") or ".")
    except (ValueError, AttributeError):
        return Path(".")


def _from_pid(pid: int) -> Path:
    try:
        blob = Path(f"/proc/{pid}/environ").read_bytes()
    except FileNotFoundError:
        raise Refused(f"no process {pid} on this host") from None
    except OSError as exc:
        raise Refused(f"cannot read the environment of process {pid} ({exc.strerror}): "
                      "only the job's user can control it") from None
    env = dict(item.split(b"=", 1) for item in blob.split(b"\0") if b"=" in item)
    if env.get(b"PROFILING_MODE") != b"dynamic":
        raise Refused(f"process {pid} does not run in dynamic mode (PROFILING_MODE="
                      f"{env.get(b'PROFILING_MODE', b'unset').decode(errors='replace')!r})")
    named = env.get(profdir.JOB_ENV.encode())
    if named:  # a rank started by a launcher that named the job
        return Path(os.fsdecode(named))
    # the process named its job itself, after it started: the folder whose status it writes
    # (or one of its ranks, for a launcher), under the output its options name
    try:
        given = json.loads(env.get(b"PROFILING_OPTIONS", b"") or b"{}")
        output = Path(os.readlink(f"/proc/{pid}/cwd"), given.get("output") or ".")
    except (ValueError, OSError, AttributeError):
        raise Refused(f"cannot tell the output folder of process {pid} from its PROFILING_OPTIONS") from None
    for job in reversed(_jobs_under(output)):
        try:
            states = _states(job)
        except Refused:
            continue
        if any(pid in (s.get("pid"), s.get("ppid")) for s in states):
            return job
    raise Refused(f"process {pid} has no status under {output} yet (a job writes it at its first "
                  "iteration end)")


def _jobs_under(path: Path) -> list[Path]:
    if profdir.PROF_RE.match(path.name):
        return [path]
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        raise Refused(f"{path} does not exist") from None
    except PermissionError:
        raise Refused(f"cannot read {path} (permission denied): only the job's user can control it") from None
    return [path / n for n in names if profdir.PROF_RE.match(n) and (path / n / control.FOLDER).is_dir()]


def _states(job: Path) -> list[dict[str, Any]]:
    folder = control.folder_of(job)
    try:
        control.check_folder(folder)
        return control.statuses(folder)
    except FileNotFoundError:
        raise Refused(f"{job} has no control folder: it is not a job in dynamic mode, or none of its "
                      "ranks has finished an iteration yet") from None
    except PermissionError:
        raise Refused(f"cannot read {folder} (permission denied): only the job's user can "
                      "control it") from None
    except Untrusted as exc:
        raise Refused(f"{exc}: only the job's user can control it, and the folder must be closed "
                      "to others") from None


def _target(args: argparse.Namespace, live_only: bool = True) -> tuple[Path, list[dict[str, Any]]]:
    if args.pid is not None:
        job = _from_pid(args.pid)
        return job, _states(job)
    where = args.job if args.job is not None else _default_output()
    jobs = _jobs_under(where)
    found = []
    for job in jobs:
        try:
            states = _states(job)
        except Refused:
            if len(jobs) == 1:
                raise
            continue
        if not live_only or any(control.live(s) and not s.get("ended") for s in states):
            found.append((job, states))
    if not found:
        raise Refused(f"no job in dynamic mode is running under {where} (a job writes its status "
                      "at its first iteration end, then every second)")
    if len(found) > 1:
        raise Refused(f"{len(found)} jobs in dynamic mode are running under {where}: "
                      f"{', '.join(j.name for j, _ in found)}; name one with --job {where}/PROF_...")
    return found[0]


def _live(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in states if control.live(s) and not s.get("ended")]


def _who_is(status: dict[str, Any]) -> str:
    rank = status.get("rank")
    return f"rank {rank}" if isinstance(rank, int) else f"process {status.get('pid')}"


def _busy(states: list[dict[str, Any]]) -> str | None:
    for status in _live(states):
        capture, pending = status.get("capture") or {}, status.get("pending") or {}
        if capture or pending:
            what = (f"iterations {capture['first']}-{capture['last']}" if capture
                    else f"from iteration {pending['at']}")
            return (f"capture {(capture or pending)['id']} is running on {_who_is(status)} ({what}; "
                    "`jobprof stop` ends it)")
        if status.get("finishing"):
            return (f"the last capture is still being written by {_who_is(status)}; try again "
                    "in a moment")
    return None


def _who(command: str) -> str:
    """Who asked: the command, user, host and pid (a request's ``by``)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = f"uid {os.geteuid()}"
    return f"jobprof {command} ({user}@{socket.gethostname()}, pid {os.getpid()})"


# -- commands ----------------------------------------------------------------------------------
def run_start(args: argparse.Namespace) -> int:
    try:
        return _start(args)
    except Refused as exc:
        print(printable(f"jobprof start: {exc}"), file=sys.stderr)
        return REFUSED if isinstance(exc, Busy) else CANNOT


def _start(args: argparse.Namespace) -> int:
    job, states = _target(args)
    live = _live(states)
    busy = _busy(states)
    if busy:
        raise Busy(f"refused: {busy}")
    given: dict[str, Any] = {}
    if args.options:
        try:
            given = json.loads(args.options)
        except ValueError as exc:
            raise Refused(f"--options is not valid JSON: {exc}") from None
        if not isinstance(given, dict):
            raise Refused("--options must be a JSON object of PROFILING_OPTIONS keys")
        if "output" in given or "trigger" in given:
            raise Refused("--options cannot set output or trigger: a capture is written beside the "
                          "job's folder")
    job_options = dict(live[0].get("options") or {}) if live else {}
    _validate({**job_options, **given})
    rate = max((float(s.get("rate") or 0) for s in live), default=0.0)
    if args.seconds is not None:
        if rate <= 0:
            raise Refused("--seconds needs the job's iteration rate, which no rank has reported yet; "
                          "use --iterations")
        iterations = max(1, math.ceil(args.seconds * rate))
    else:
        iterations = args.iterations or DEFAULT_ITERATIONS
    unknown = [s for s in live if not s.get("rate")]
    if unknown and not args.at:
        raise Refused(f"{_who_is(unknown[0])} has not run enough iterations for its rate to be "
                      "known (3); try again in a moment, or name the first iteration with --at")
    earliest = control.agreed_iteration(live)
    if earliest is None:
        raise Refused(f"no rank of {job.name} has reported in the last {control.STALE_S:g} s: "
                      "the job has ended or is stuck in an iteration")
    at = args.at or earliest
    if at < earliest:
        raise Refused(f"--at {at} is too soon: the ranks are near iteration "
                      f"{max(s['iteration'] for s in live)}; the earliest every rank can make is {earliest}")
    folder = control.folder_of(job)
    name, claim = profdir.job_dir(str(job.parent), {})
    if claim is not None:
        claim.close()
    for _ in range(5):
        number = control.next_id(folder)
        request = {"id": number, "at": at, "iterations": iterations, "options": given,
                   "prof_dir": name.name, "trigger": "manual", "reason": "asked with jobprof start",
                   "by": _who("start"), "created": time.time()}
        try:
            if control.publish(folder, control.request_name("start", number), request, exclusive=True):
                break
        except PermissionError:
            raise Refused(f"cannot write in {folder} (permission denied): only the job's user can "
                          "start a capture") from None
    else:
        raise Refused("another request was written at the same moment five times; try again")
    asked = f"iterations {at}-{at + iterations - 1} of {job.name}"
    procs = {_ident(s): s for s in live}
    # the job's answer first: a request may be refused (two starts at once: the job takes the
    # first it reads), and only an accepted one has a folder to name
    rates = [float(s.get("rate") or 0) for s in live]
    answer_s = 3600.0 if args.wait else min(ANSWER_S[1], max(
        ANSWER_S[0], 3 / min(rates) if all(rates) else ANSWER_S[1]))
    answers = _answers(job, number, procs, lambda a: a.state != "waiting", answer_s)
    silent = [p for p, a in answers.items() if a.state in ("waiting", "unknown")]
    if silent:
        print(printable(
            f"jobprof start: capture {number} asked for ({asked}), but {_names(procs, silent)} "
            f"gave no answer within {answer_s:g} s (a request is read at an iteration end): "
            f"whether it runs is not known yet. `jobprof status --job {job}` tells: it lists the "
            f"capture if it runs (written into {job.parent / name.name}), or says 'capture {number} "
            "refused' and why"), file=sys.stderr)
        return NO_ANSWER
    accepted = [p for p, a in answers.items() if a.state in (*UNDERWAY, "captured")]
    if not accepted:
        _say_refused(number, procs, answers)
        return REFUSED
    print(printable(f"capture {number}: {asked} ({len(accepted)} of {len(procs)} process(es)) "
                    f"into {job.parent / name.name}"))
    if len(accepted) < len(procs):
        _lines(procs, {p: a for p, a in answers.items() if p not in accepted}, sys.stderr)
    if not args.wait:
        print("`jobprof status` follows it; `jobprof stop` ends it early")
        return 0 if len(accepted) == len(procs) else PARTIAL
    return _wait(job, number, procs)


def _ident(status: dict[str, Any]) -> tuple[str, int]:
    """A process of the job, whatever its status file is named (a rank's name changes from its
    pid's once its rank is known)."""
    return str(status.get("host")), int(status.get("pid") or 0)


def _names(procs: dict[tuple[str, int], dict[str, Any]], which: list[tuple[str, int]]) -> str:
    return ", ".join(_who_is(procs[p]) for p in which)


def _answer(status: dict[str, Any] | None, number: int) -> Answer:
    """What ``status`` (a process's status file; None: gone) says about start request ``number``:
    from the request's id in its fields, never from the text of a message (which names other
    captures too: 'capture 2 refused: capture 1 is running')."""
    if status is None:
        return Answer("gone", "not captured: its status file is gone")
    for refusal in status.get("refusals") or []:
        if refusal.get("id") == number:
            return Answer(str(refusal.get("state") or "refused"), str(refusal.get("why")))
    for key in ("capture", "pending"):
        found = status.get(key) or {}
        if found.get("id") == number:
            return (Answer("running", f"capturing iterations {found['first']}-{found['last']}")
                    if key == "capture" else Answer("pending", f"capture from iteration {found['at']}"))
    entry = next((c for c in status.get("captures") or [] if c.get("id") == number), None)
    if entry is not None:
        its = f"iterations {entry['first']}-{entry['last']}"
        if entry.get("state") == "running":
            return Answer("running", f"capturing {its}")
        if status.get("finishing") and status.get("finishing_id") in (number, None):
            return Answer("writing", f"{its}, being written")
        done = entry.get("state") if entry.get("state") != "finished" else ""
        note = "; ".join(x for x in (entry.get("note"), done) if x)
        return Answer("captured", its + (f" ({note})" if note else ""))
    if status.get("ended"):
        return Answer("ended", f"not captured: the process ended ({status['ended']}) before it")
    if int(status.get("seen") or 0) >= number:
        return Answer("unknown", f"read the request, but its answer has left its status (`jobprof "
                                 f"status` lists captures by number: {number} is not among them)")
    return Answer("waiting", "has not read the request yet")


def _answers(job: Path, number: int, procs: dict[tuple[str, int], dict[str, Any]],
             settled: Callable[[Answer], bool], timeout_s: float) -> dict[tuple[str, int], Answer]:
    """Each of ``procs``'s answer to request ``number``, once all are ``settled`` (or when
    ``timeout_s`` has passed: as they are then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = {_ident(s): s for s in _states(job)}
        answers = {p: _dead_or(p, _answer(now.get(p), number)) for p in procs}
        if all(settled(a) for a in answers.values()) or time.monotonic() >= deadline:
            return answers
        time.sleep(0.1)


def _dead_or(proc: tuple[str, int], answer: Answer) -> Answer:
    """``answer``, unless the process it waits on is gone from this host without ending (killed:
    SIGKILL, the OOM killer): nothing more will come from it."""
    host, pid = proc
    if answer.state not in (*UNDERWAY, "waiting") or host != socket.gethostname() or pid <= 0:
        return answer
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        what = ("died during the capture (`jobprof export` renders what it wrote)"
                if answer.state in ("running", "writing") else "died before it began")
        return Answer("died", f"not captured whole: the process (pid {pid}) {what}")
    except OSError:
        pass  # another user's: alive
    return answer


def _lines(procs: dict[tuple[str, int], dict[str, Any]], answers: dict[tuple[str, int], Answer],
           out: Any = None) -> None:
    """One line per process: its outcome."""
    def order(p: tuple[str, int]) -> tuple[int, int, str, int]:
        rank = procs[p].get("rank")
        return (0, rank, *p) if isinstance(rank, int) else (1, 0, *p)

    for p in sorted(answers, key=order):
        print(printable(f"  {_who_is(procs[p])}: {answers[p].text}"), file=out or sys.stdout)


def _say_refused(number: int, procs: dict[tuple[str, int], dict[str, Any]],
                 answers: dict[tuple[str, int], Answer]) -> None:
    """Every process refused request ``number`` (or ended before it): why, on stderr."""
    whys = {a.text for a in answers.values()}
    if len(whys) == 1:
        print(printable(f"jobprof start: {whys.pop()}; nothing was captured"), file=sys.stderr)
        return
    print(printable(f"jobprof start: capture {number} refused; nothing was captured:"), file=sys.stderr)
    _lines(procs, answers, sys.stderr)


def _validate(merged: dict[str, Any]) -> None:
    from jobprof.engine.configure import prepare

    manager, _ = new_manager()
    outcome, _ = prepare(manager, {}, json.dumps(merged))
    if outcome.config is None:
        raise Refused("the capture's options are invalid:\n  "
                      + "\n  ".join(p.render() for p in outcome.problems))


def _wait(job: Path, number: int, procs: dict[tuple[str, int], dict[str, Any]],
          timeout_s: float = 3600.0) -> int:
    """Until every process that was live has finished capture ``number`` (or refused it, or
    ended): one line each, and the exit status."""
    answers = _answers(job, number, procs, lambda a: a.state not in (*UNDERWAY, "waiting"), timeout_s)
    _lines(procs, answers)
    if any(a.state in (*UNDERWAY, "waiting") for a in answers.values()):
        print(f"jobprof start: gave up waiting for capture {number} after {timeout_s:g} s", file=sys.stderr)
        return NO_ANSWER
    if any(a.state in ("unknown", "died") for a in answers.values()):
        return NO_ANSWER
    captured = sum(a.state == "captured" for a in answers.values())
    return 0 if captured == len(procs) else PARTIAL if captured else REFUSED


def run_stop(args: argparse.Namespace) -> int:
    try:
        job, states = _target(args)
        live = _live(states)
        running: list[dict[str, Any]] = [s.get("capture") or s["pending"] for s in live
                                         if s.get("capture") or s.get("pending")]
        if not running:
            raise Refused(f"no capture is running in {job.name}")
        number = running[0]["id"]
        earliest = control.agreed_iteration(live) or 1
        at = max(args.at or earliest, earliest)
        folder = control.folder_of(job)
        stop = {"id": number, "at": at, "by": _who("stop"), "created": time.time()}
        try:
            control.publish(folder, control.request_name("stop", number), stop, exclusive=True)
        except PermissionError:
            raise Refused(f"cannot write in {folder} (permission denied): only the job's user can "
                          "stop a capture") from None
    except Refused as exc:
        print(printable(f"jobprof stop: {exc}"), file=sys.stderr)
        return 2
    print(printable(f"capture {number} of {job.name} ends before iteration {at} on every rank"))
    return 0


def run_status(args: argparse.Namespace) -> int:
    try:
        job, states = _target(args, live_only=False)
    except Refused as exc:
        print(printable(f"jobprof status: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"job": str(job), "ranks": states}, indent=2))
        return 0
    now = time.time()
    rows = []
    for s in sorted(states, key=lambda s: str(s.get("key"))):
        capture = s.get("capture") or {}
        pending = s.get("pending") or {}
        doing = (f"{capture['id']}: {capture['first']}-{capture['last']}" if capture
                 else f"{pending['id']}: from {pending['at']} (preparing)" if pending
                 else "finishing" if s.get("finishing") else "-")
        state = f"ended ({s['ended']})" if s.get("ended") else "live" if control.live(s, now) else "no news"
        rows.append([s.get("rank"), s.get("pid"), s.get("host"), s.get("iteration"), s.get("rate") or "N/A",
                     doing, len(s.get("captures", [])), state, f"{now - float(s.get('time', now)):.1f}"])
    print(printable(f"{job}"))
    print(printable(tabulate(rows, headers=["rank", "pid", "host", "iteration", "it/s", "capture",
                                            "captures", "state", "age s"])))
    seen: dict[int, dict[str, Any]] = {}
    for s in states:
        for c in s.get("captures", []):
            seen.setdefault(c["id"], c)
    if seen:
        print()
        print(printable(tabulate([[c["id"], c["trigger"], f"{c['first']}-{c['last']}", c["state"],
                                   c["prof_dir"], c.get("reason", "")] for _, c in sorted(seen.items())],
                                 headers=["capture", "trigger", "iterations", "state", "folder", "why"])))
    refused = sorted({r for s in states for r in s.get("refused", [])})
    for line in refused:
        print(printable(f"note: {line}"))
    return 0
