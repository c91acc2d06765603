"""Record, on a lent GPU machine, what the CUDA paths read, so they can be tested without one.

    python3 tests/gpu/record.py OUT_DIR      (jobprof installed in that python; ~2 minutes)

Runs tests/test_cuda.py's jobs (a small CUDA training loop; a 1-rank NCCL DDP job; a
torch.compile'd CUDA model) under jobprof with the operator tier, plus a direct probe of the
hccl capture on NCCL (every record, error and pending work printed), and packs each profile
folder with the jobs' output into ``OUT_DIR/recorded.tar.gz``: the Kineto window files
(kernels, NCCL kernels, Triton kernels and their launches as this torch writes them), the raw
streams, the rendered files.  Nothing here asserts: it is the evidence the CPU tests are built on
(tests/data/) and what a session reads when a GPU check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

HCCL_PROBE = """
import os, socket, sys, time, traceback, torch, torch.distributed as dist
from torch import nn
from jobprof.plugins.hccl.capture import Capture
from jobprof.plugin import Iteration
os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
dev = torch.device("cuda:0"); torch.cuda.set_device(dev)
warnings = []
capture = Capture(torch, warnings.append)
capture.install()
model = torch.nn.parallel.DistributedDataParallel(nn.Linear(1024, 1024).to(dev), device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = time.monotonic_ns()
for i in range(3):
    opt.zero_grad()
    model(torch.randn(64, 1024, device=dev)).sum().backward()
    work = dist.all_reduce(torch.ones(1 << 20, device=dev), async_op=(i == 2))
    if work is not None:
        work.wait()
    opt.step()
torch.cuda.synchronize()
print("recorded", capture.recorded, "errors", capture.errors, "warnings", warnings)
pending = capture._open.values()
print("open", [(r["op"], kind, type(w).__name__, w.is_completed()) for r, w, kind, _ in pending])
try:
    took = capture.take(Iteration(1, start, time.monotonic_ns(), "explicit"))
    print("take", len(took))
    for r in took:
        print(" ", r)
except Exception:
    traceback.print_exc()
print("after take: open", len(capture._open), "done", len(capture._done), "notes", capture.exit_notes())
capture.uninstall()
dist.destroy_process_group()
print("HCCL PROBE DONE")
"""


def main() -> int:
    import test_cuda  # the jobs are the test's own

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu-record")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-record-"))
    jobs = {
        "train": (test_cuda.JOB, {"training_trace": "on", "task_trace": "on", "aicpu": "on",
                                  "aic_metrics": "ArithmeticUtilization"}),
        "train_no_cupti": (test_cuda.JOB, {"training_trace": "on", "task_trace": "on", "aicpu": "on"}),
        "nccl": (test_cuda.NCCL_JOB, {"training_trace": "on", "task_trace": "on", "hccl": "on"}),
        "compiled": (test_cuda.COMPILED, {"training_trace": "on", "task_trace": "on", "fusion_op": "on"}),
        "hccl_probe": (HCCL_PROBE, None),
    }
    summary = {}
    for name, (body, options) in jobs.items():
        folder = work / name
        folder.mkdir()
        script = folder / "job.py"
        script.write_text(textwrap.dedent(body))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROFILING_")}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
        if options is not None:
            env.update(PROFILING_MODE="true",
                       PROFILING_OPTIONS=json.dumps({"output": str(folder / "prof"), **options}))
        began = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=env, capture_output=True,
                                  text=True, timeout=240)
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, stdout, stderr = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
        (folder / "stdout.txt").write_text(stdout)
        (folder / "stderr.txt").write_text(stderr)
        summary[name] = {"exit": code, "seconds": round(time.monotonic() - began, 1),
                         "stderr_tail": stderr.splitlines()[-8:]}
        print(f"== {name}: exit {code} in {summary[name]['seconds']} s")
        print("\n".join(stdout.splitlines()[-20:]))
        print("\n".join(stderr.splitlines()[-15:]))
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    with tarfile.open(out / "recorded.tar.gz", "w:gz") as tar:
        for folder in sorted(work.iterdir()):
            tar.add(folder, arcname=folder.name,
                    filter=lambda info: None if "/inductor" in info.name else info)
    print("recorded:", out / "recorded.tar.gz", (out / "recorded.tar.gz").stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
