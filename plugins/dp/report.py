"""The DataLoader section of ``jobprof summary``: how long the loop waited, and why."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from jobprof.plugin import DATA_WAIT, BatchRecord, Finding, Section, WorkerFetchRecord, records_of
from jobprof.plugins.dp.records import LoaderRecord, profile_records
from jobprof.plugins.dp.writer import STREAM

if TYPE_CHECKING:
    from jobprof.plugin import Profile

#: share of iteration time spent waiting above which a loop is called data-bound
DATA_BOUND_SHARE = 0.10


def _median(values: list[Any]) -> Any:
    return statistics.median(values) if values else None


def rank_facts(profile: Profile, device: int) -> list[dict[str, Any]] | None:
    """This device's DataLoaders, in loader order: per loader what its ``loader`` record said
    (``about``: dataset, workers, where given), how many batches, the medians in ns (None
    without a value) of the wait in ``next()``, the worker's fetch and collate and the batches
    buffered at request, and the share of iteration time spent waiting over the ``kept``
    iterations; None without a loader."""
    windows = {it.index: (it.start_ns, it.end_ns) for it in profile.iterations(device)}
    waited: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # loader, iteration
    stats: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    names: dict[int, LoaderRecord] = {}
    # a damaged or foreign record is not decoded: left out, as the writer does
    for iteration, rec in profile_records(profile, device):
        s = stats[rec.loader]
        if isinstance(rec, LoaderRecord):
            names[rec.loader] = rec
        elif isinstance(rec, BatchRecord):
            s["wait"].append(rec.end_ns - rec.start_ns)
            # the share counts waits inside iterations only (not e.g. worker start-up before
            # the first step)
            start, end = windows.get(iteration, (0, 0))
            waited[rec.loader][iteration] += max(0, min(rec.end_ns, end) - max(rec.start_ns, start))
            if rec.buffered_before is not None:
                s["buffered"].append(rec.buffered_before)
            if rec.produced is not None:
                fetch_start, collate_start, collate_end, _ = rec.produced
                s["fetch"].append(collate_start - fetch_start)
                s["collate"].append(collate_end - collate_start)
        elif isinstance(rec, WorkerFetchRecord):  # a worker's fetch and collate
            s["fetch"].append(rec.collate_start - rec.fetch_start)
            s["collate"].append(rec.end - rec.collate_start)
    loaders = []
    for loader in sorted(stats):
        s, about = stats[loader], names.get(loader)
        # time-weighted over the iterations that used the loader, the first one per worker
        # left out: each worker's first batch holds its start-up (a spawned worker imports
        # torch), which must not decide the verdict of a whole run.  Not a median of
        # per-iteration shares: workers that finish together make those bimodal (a long
        # wait, then a batch already there), and the median of a bimodal list flips
        workers = about.workers if about is not None else None
        start_up = workers if isinstance(workers, int) and workers > 0 else 1
        used = sorted(i for i in waited[loader] if i in windows and windows[i][1] > windows[i][0])
        kept = used[start_up:] or used
        span = sum(windows[i][1] - windows[i][0] for i in kept)
        share = sum(waited[loader][i] for i in kept) / span if span else 0.0
        kept_about = {"dataset": about.dataset, "workers": about.workers} if about is not None else {}
        loaders.append({"loader": loader, "about": kept_about,
                        "batches": len(s["wait"]), "wait": _median(s["wait"]), "fetch": _median(s["fetch"]),
                        "collate": _median(s["collate"]), "buffered": _median(s["buffered"]),
                        "share": share, "kept": len(kept)})
    return loaders or None


def _ms(median: Any) -> str:
    return f"{median / 1e6:.3f}" if median is not None else "N/A"


def dp_sections(profile: Profile) -> list[Section]:
    rows, findings = [], []
    notes: list[str] = []
    for device in profile.devices:
        for facts in profile.facts("dp", device, rank_facts) or ():
            loader, about, share, kept = facts["loader"], facts["about"], facts["share"], facts["kept"]
            buffered = f"{facts['buffered']:g}" if facts["buffered"] is not None else "N/A"
            verdict = "data-bound" if share >= DATA_BOUND_SHARE else "keeps up"
            rows.append([device, f"loader{loader}", about.get("dataset", "?"), about.get("workers", "?"),
                         facts["batches"], _ms(facts["wait"]), f"{100 * share:.1f}", _ms(facts["fetch"]),
                         _ms(facts["collate"]), buffered, verdict])
            if verdict == "data-bound":
                if not about.get("workers"):
                    why = ("num_workers=0: the loop fetched every batch itself; DataLoader workers "
                           "or a cheaper dataset/transform would help")
                elif buffered == "0":
                    why = (f"no batch was ready when the loop asked (median buffered 0), so all "
                           f"{about['workers']} workers were busy; more workers or a cheaper "
                           "dataset/transform would help")
                else:  # batches were waiting, yet next() took time: the hand-over is the cost
                    why = (f"batches were ready when the loop asked (median buffered {buffered}), so "
                           "the wait is the hand-over from the worker processes (unpickling, "
                           "shared-memory tensors), not their production; fewer, larger tensors "
                           "per batch help more than more workers")
                who = f"rank {profile.rank(device)} " if len(profile.devices) > 1 else ""
                findings.append(Finding(
                    "data_bound", f"data-bound: {who}loader{loader} ({about.get('dataset', '?')}): the loop "
                    f"waited for the DataLoader in {100 * share:.1f}% of iteration time (over {kept} "
                    f"iterations, each worker's first batch left out); {why}",
                    {"rank": profile.rank(device), "loader": loader, "share": share,
                     "iterations": kept, "workers": about.get("workers"),
                     "buffered_median": None if buffered == "N/A" else float(buffered)},
                    weight=3 if share >= 3 * DATA_BOUND_SHARE else 2))
    if not rows:
        return []
    notes.append("wait % of iter: the loop's wait in next() over the time of the iterations after each "
                 "worker's first batch (workers starting are left out); the breakdown's data wait share "
                 "counts every iteration")
    return [Section("DataLoader (median per batch, ms)",
                    ["device", "loader", "dataset", "workers", "batches", "wait", "wait % of iter",
                     "fetch", "collate", "buffered at request", "verdict"], rows, notes,
                    key="dataloader", findings=findings)]


def wait_spans(streams: Mapping[str, list[Any]]) -> dict[str, list] | None:
    """The loop's waits in ``next()`` (an iteration with dp on but no wait reports none)."""
    if STREAM not in streams:
        return None
    return {DATA_WAIT: [(b.start_ns, b.end_ns) for b in records_of(streams, BatchRecord)]}
