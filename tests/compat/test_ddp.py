"""A 2-rank gloo DistributedDataParallel job under torchrun, profiled and unprofiled in the
same test: every rank's losses equal, and each rank's device folder has one iteration per step."""

from __future__ import annotations

import re
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import DEFAULT_SETS, OPTION_SETS, assert_iterations, assert_same, assert_summary_sane, facts, run

#: the program prints nothing that varies run to run
NOTHING = re.compile(r"(?!)")
RANKS = 2


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free now, all held until all are chosen."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def torchrun(port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={RANKS}",
            "--master_addr=127.0.0.1", f"--master_port={port}"]


@pytest.mark.slow
def test_ddp_gloo(tmp_path):
    # run_matrix's arms share one launcher: here each arm has its own master port, two at a time
    sets = (*DEFAULT_SETS, "memory") if "l1" in DEFAULT_SETS else DEFAULT_SETS  # task_memory per rank
    jobs = {"unprofiled": None, **{name: OPTION_SETS[name] for name in sets}}
    ports = free_ports(len(jobs))
    with ThreadPoolExecutor(2) as pool:
        futures = {label: pool.submit(run, "ddp.py", tmp_path, label, opts, ["6"], timeout=600,
                                      launcher=torchrun(port))
                   for (label, opts), port in zip(jobs.items(), ports, strict=True)}
        runs = {label: f.result() for label, f in futures.items()}
    base = runs.pop("unprofiled")
    steps = int(facts(base)["STEPS"])
    assert steps == 6, base.describe()
    assert f"rank{RANKS - 1} STEPS {steps}" in base.stdout.splitlines(), base.describe()
    for run_ in runs.values():
        assert_same(base, run_, NOTHING)
        for device in range(RANKS):
            assert_iterations(run_, steps, "optimizer_step", device=device)
            model = assert_summary_sane(run_, device=device)
            if run_.label == "memory":  # every rank's peak, and its allocations in operator_memory
                rows = model["sections"]["memory"]["rows"]
                assert sorted(row[0] for row in rows) == list(range(RANKS)), rows
                summary = run_.prof_dir() / f"device_{device}" / "summary"
                assert len(list(summary.glob("operator_memory_*.csv"))) == steps
