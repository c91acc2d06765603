"""dp probes: what the DataLoader instrumentation costs per batch, in the loop and in a worker.

Runs in this process (no profiling session): a single-process DataLoader over a trivial dataset
is iterated with the dp collector installed and without it, interleaved, and the difference per
batch is the loop-side cost (the ``__next__`` wrapper: two stamps, two buffered counts, one
tuple; plus the fetch wrapper, which in a worker also runs).  The worker-side cost is the fetch
wrapper plus one real datagram to a real receiver thread, timed on the same code a worker runs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

BATCHES = 3000


def _loop_once(torch: Any, batches: int) -> float:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.zeros(batches, 4))
    start = time.perf_counter_ns()
    for _ in DataLoader(data, batch_size=1):
        pass
    return (time.perf_counter_ns() - start) / batches


def loop_side(repeats: int, batches: int = BATCHES) -> dict[str, Any]:
    import torch

    from jobprof.plugins.dp.loader import LoaderCollector

    plain, probed = [], []
    _loop_once(torch, 200)  # warm
    for i in range(repeats):
        for arm in (("plain", "probed") if i % 2 == 0 else ("probed", "plain")):
            collector = LoaderCollector()
            if arm == "probed":
                collector.install(torch)
            try:
                (probed if arm == "probed" else plain).append(_loop_once(torch, batches))
            finally:
                collector.uninstall()
    deltas = [b - a for a, b in zip(plain, probed, strict=True)]
    return {"plain_ns_per_batch": statistics.median(plain),
            "probed_ns_per_batch": statistics.median(probed),
            "delta_ns_per_batch": statistics.median(deltas), "repeats": repeats, "batches": batches}


def worker_side(repeats: int, batches: int = BATCHES) -> dict[str, Any]:
    import os

    from jobprof.plugins.dp import fetch
    from jobprof.plugins.dp.channel import Receiver, Sender

    received = []
    receiver = Receiver(received.append)
    link = fetch.WorkerLink()
    link._pid, link._sender = os.getpid(), Sender(receiver.address)  # a worker's first batch does this

    class Info:  # torch's WorkerInfo has these two fields
        seed, id = 1234, 0

    class Fetcher:
        auto_collation = True

        def __init__(self) -> None:
            self.collate_fn = list

        def fetch(self, index: Any) -> Any:
            return self.collate_fn([i for i in index])

    wrapped = fetch.timed_fetch(Fetcher.fetch, link, lambda: Info)
    index = [0, 1, 2, 3]
    plain, probed = [], []
    try:
        for _ in range(repeats):
            for fn, out in ((Fetcher.fetch, plain), (wrapped, probed)):
                f = Fetcher()
                start = time.perf_counter_ns()
                for _ in range(batches):
                    fn(f, index)
                out.append((time.perf_counter_ns() - start) / batches)
                time.sleep(0.05)  # let the receiver drain: a worker is never this fast
    finally:
        receiver.close()
    # a tight loop outruns the receiver thread (the socket queue holds max_dgram_qlen
    # datagrams); real workers send one per batch, milliseconds apart
    return {"plain_ns_per_batch": statistics.median(plain),
            "probed_ns_per_batch": statistics.median(probed),
            "delta_ns_per_batch": statistics.median(b - a for a, b in zip(plain, probed, strict=True)),
            "datagrams_received": len(received), "datagrams_sent": repeats * batches,
            "repeats": repeats, "batches": batches}


def run(repeats: int) -> dict[str, Any]:
    return {"loop": loop_side(repeats), "worker": worker_side(repeats)}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    loop, worker = result["loop"], result["worker"]
    return [
        {"benchmark": "dp probes, loop side (per batch, num_workers=0 loader)",
         "baseline": f"{loop['plain_ns_per_batch'] / 1e3:.1f} us",
         "profiled": f"{loop['probed_ns_per_batch'] / 1e3:.1f} us",
         "delta / ratio": f"+{loop['delta_ns_per_batch'] / 1e3:.1f} us",
         "spread": f"{loop['repeats']} interleaved repeats",
         "target": "-", "result": "info"},
        {"benchmark": "dp probes, worker side (fetch wrapper + 1 datagram per batch)",
         "baseline": f"{worker['plain_ns_per_batch'] / 1e3:.1f} us",
         "profiled": f"{worker['probed_ns_per_batch'] / 1e3:.1f} us",
         "delta / ratio": f"+{worker['delta_ns_per_batch'] / 1e3:.1f} us",
         "spread": f"{worker['repeats']} interleaved repeats",
         "target": "-", "result": "info"},
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5), indent=1))
