"""jobprof's own work is jobprof's: its start-up is outside every iteration, and what a run
ended of is said truly (findings 6 and 7 of the do-no-harm issue)."""

from __future__ import annotations

from harness import (
    OPTION_SETS,
    assert_iterations,
    assert_same,
    assert_summary_sane,
    facts,
    iterations,
    run,
    step_trace_rows,
    summary,
)


def test_calibration_is_jobprofs_start_up_not_iteration_one(tmp_path):
    base = run("small.py", tmp_path, "unprofiled")
    # a cache of its own: the calibration is measured in this job (the suite's shared cache would
    # hand it the peaks an earlier test measured, in a few ms)
    prof = run("small.py", tmp_path, "aic", OPTION_SETS["aic"],
               env={"JOBPROF_CACHE_DIR": str(tmp_path / "cache")})
    assert_same(base, prof)
    assert_iterations(prof, int(facts(base)["STEPS"]), "optimizer_step")
    _, info = iterations(prof)
    assert info["calibration"]["source"] == "measured", info["calibration"]
    calibration_ms = info["calibration"]["seconds"] * 1000
    startup = info["own_startup_ms"]
    # the calibration ran at the first root forward, and all of it is on jobprof's bill
    assert startup["calibration"] >= 0.9 * calibration_ms > 0, (startup, calibration_ms)
    assert "operator capture start" in startup, startup
    # and before the session began: jobprof's imports, plugins and options, timed from the autoload
    assert 0 < info["bootstrap_ms"] < 60_000, info.get("bootstrap_ms")
    # iteration 1's forward started after it: FP→BP holds the job's forward+backward only
    first = step_trace_rows(prof)[1]
    assert float(first["FP to BP Time(us)"]) / 1e3 < calibration_ms / 2, (first, calibration_ms)
    model = assert_summary_sane(prof)
    assert not any(f["key"] == "warmup" and f["evidence"]["iteration_ms"] > calibration_ms
                   for f in model["findings"]), model["findings"]


def test_uncaught_exception_is_the_end_reason(tmp_path):
    base = run("small.py", tmp_path, "unprofiled", args=["raise"])
    prof = run("small.py", tmp_path, "step", OPTION_SETS["step"], args=["raise"])
    assert base.code == 1 and "RuntimeError: the program's own error" in base.stderr
    assert prof.code == base.code and prof.own_stderr() == base.own_stderr(), prof.describe()
    assert prof.stdout == base.stdout
    its, info = iterations(prof)
    assert len(its) == 3 and info["end_reason"] == "exception: RuntimeError", info.get("end_reason")


def test_dp_on_without_a_dataloader_is_not_called_off(tmp_path):
    prof = run("small.py", tmp_path, "step", OPTION_SETS["step"])
    assert prof.code == 0, prof.describe()
    missing = " ".join(summary(prof)["missing"])
    assert "dp was on but no DataLoader was seen" in missing and "dp was off" not in missing, missing
