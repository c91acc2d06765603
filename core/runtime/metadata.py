"""What the device folder says about the run: which device and rank this process is (claimed at
the first iteration's end), the files that describe it (``start_info``, ``end_info``,
``info.json``: device, options, plugins, jobprof's start-up time, what stopped mid-run and, at
the end, what was written, rendered and aged) and the export's
:class:`~jobprof.files.export.DeviceMeta`; with :class:`Disabled`, the record of what stopped
working mid-run that info.json lists.  A field of info.json changes here only.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from jobprof import __version__
from jobprof.engine.manager import PluginManager
from jobprof.files import export, profdir
from jobprof.files.fsio import write_with_done
from jobprof.ops.opcapture import STREAM as OPS_STREAM
from jobprof.plugin.clock import ClockAnchor
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.values import Config
from jobprof.runtime import deviceinfo
from jobprof.runtime.sink import Sink


class Disabled:
    """What stopped working mid-run, said once each and kept in info.json (``disabled``) so that
    ``jobprof summary`` lists it: a failed plugin, the operator capture."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self._found: dict[str, dict[str, Any]] = {}
        # not the session's lock: the training thread holds that through finish() while it
        # waits for the sink thread's work (settle, close): both then waited for ever
        self._lock = threading.Lock()
        #: the iteration each failed plugin failed at
        self._failed_at: dict[str, int | None] = {}

    def core_stream_failed(self, stream: str, index: int, message: str) -> bool:
        """The records of a core stream (the operator capture's) could not be built (sink
        thread): said once (True then), the other plugins carry on."""
        what = "operator capture" if stream == OPS_STREAM else f"core stream '{stream}'"
        with self._lock:
            if what in self._found:
                return False
            self._found[what] = {"what": what, "reason": message, "iteration": index}
        self.reporter.warning(f"{what} stopped: its records of iteration {index} could not be read "
                              f"({message}); operator-tier files end before that iteration, the "
                              "other plugins carry on")
        return True

    def plugin_failed(self, name: str, index: int | None) -> None:
        self._failed_at.setdefault(name, index)

    def listed(self, manager: PluginManager, ops_error: str | None) -> list[dict[str, Any]]:
        """For info.json: failed plugins (their first error), the operator capture."""
        found = dict(self._found)
        for record in manager.records():
            if record.status == "failed" and record.name not in found:
                found[record.name] = {"what": f"plugin '{record.name}'", "reason": record.error,
                                      "iteration": self._failed_at.get(record.name)}
        if ops_error and "operator capture" not in found:
            found["operator capture"] = {"what": "operator capture", "reason": ops_error, "iteration": None}
        return list(found.values())


class Metadata:
    """This process's device and the metadata files of its folder.  ``info`` (what plugins add
    to info.json's ``jobprof`` section) and ``own_startup`` (jobprof's work before the first
    iteration, ns by what) are the session's, read when a file is written."""

    def __init__(self, anchor: ClockAnchor, config: Config, manager: PluginManager, reporter: Reporter,
                 time_base_ns: int, info: dict[str, Any], own_startup: dict[str, int]) -> None:
        self.anchor, self.config, self.manager, self.reporter = anchor, config, manager, reporter
        self.time_base_ns, self.info, self.own_startup = time_base_ns, info, own_startup
        self.disabled = Disabled(reporter)
        self.device_id: int | None = None
        self.device_dir: Path | None = None
        self.device_source = ""
        self._rank: dict[str, Any] = {}

    def claim(self, torch: Any, job_dir: Path) -> Path:
        """Claim this process's device folder in ``job_dir`` (OSError: it cannot be made)."""
        preferred, self.device_source = profdir.preferred_device_id(torch)
        # read once, at the first iteration: by exit the process group may be destroyed
        self._rank = profdir.job_rank(torch)
        self.device_id, self.device_dir = profdir.claim_device_dir(job_dir, preferred)
        return self.device_dir

    def device_meta(self, pid: int) -> export.DeviceMeta:
        """What the export writes into every rendered file of this device (after :meth:`claim`)."""
        assert self.device_id is not None  # claimed
        meta = export.with_metrics(export.DeviceMeta(
            self.device_id, pid, self.anchor, self.config, profdir.program_name(),
            self.info.get("calibration") or {},
            job={k: v for k, v in self._rank.items() if k != "rank_from"},
            time_base_ns=self.time_base_ns), self.manager)
        group = self.config.get("aic_metrics")
        if group and meta.metrics is None:
            self.reporter.warning(f"aic_metrics '{group}': no plugin provides this metric group, "
                                  "so op_summary gets no metric columns (`jobprof plugins` shows "
                                  "which plugin answers each group)")
        return meta

    def _document(self, iteration_method: str | None, ops_error: str | None) -> dict[str, Any]:
        import torch

        assert self.device_id is not None  # claimed before metadata is written
        cuda = self.device_source == "cuda current device"
        device: dict[str, Any] = {"id": self.device_id, "type": "CUDA" if cuda else "CPU"}
        if cuda:
            device["name"] = torch.cuda.get_device_name(self.device_id)
        device.update(deviceinfo.cuda_units(torch, self.device_id) if cuda else deviceinfo.cpu_units())
        rank = dict(self._rank)
        return profdir.host_info(self.device_id, {
            "rank_id": rank.pop("rank_id", "N/A"),
            "DeviceInfo": [device],
            "jobprof": {
                "version": __version__,
                "torch": torch.__version__,
                "options": dict(self.config.values),
                "explicit": sorted(self.config.explicit),
                "options_source": self.config.source,
                "device_id_from": self.device_source,
                **rank,
                "iteration_method": iteration_method,
                "plugins": self.manager.active(),
                "own_startup_ms": {k: round(v / 1e6, 3) for k, v in self.own_startup.items()},
                "time_base_ns": self.time_base_ns,
                "disabled": self.disabled.listed(self.manager, ops_error),
                **self.info,
            },
        })

    def write(self, end_reason: str | None, sink: Sink | None, iteration_method: str | None,
              ops_error: str | None) -> None:
        """start_info and info.json (``end_reason`` None, at the first iteration's end), or
        end_info and info.json with how the run ended (OSError: not written)."""
        device_dir, dev = self.device_dir, self.device_id
        assert device_dir is not None  # claimed before metadata is written
        info = self._document(iteration_method, ops_error)
        if end_reason is None:
            write_with_done(device_dir / f"start_info.{dev}", json.dumps(self.anchor.info("Begin")))
        else:
            info["jobprof"].update({
                "end_reason": end_reason,
                "iterations_written": sink.written if sink else 0,
                "iterations_exported": sink.exported if sink else 0,
                "iterations_deferred": sink.deferred if sink else 0,
                "export_seconds": round(sink.export_seconds, 3) if sink else 0,
                "segments_aged": sink.budget.aged_units if sink else 0,
                #: iterations whose data storage_limit / low free disk deleted, [first, last] runs
                "aged": [list(r) for r in sink.budget.aged] if sink else [],
                #: iterations with raw data but no rendered files (`jobprof export` renders them)
                "unrendered": [list(r) for r in sink.unrendered] if sink else [],
                #: what writers noted while rendering (a master timeline capped), with its iterations
                "export_notes": [{"note": note, "iterations": sorted(its)}
                                 for note, its in (sink.notes.items() if sink else ())],
                "messages": list(self.reporter.messages),
            })
            write_with_done(device_dir / f"end_info.{dev}", json.dumps(ClockAnchor.now().info("End")))
        write_with_done(device_dir / f"info.json.{dev}", json.dumps(info))
