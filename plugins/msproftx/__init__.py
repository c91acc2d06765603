"""msproftx: user markers (``jobprof.mstx``), ``record_function`` and NVTX ranges -> msprof_tx files.

Sources, each a domain: the ``jobprof.mstx`` API (``default`` or the user's domains), every
``torch.autograd.profiler.record_function`` / ``torch.profiler.record_function`` block
(``record_function``, torch's own DataLoader and optimizer blocks included) and, on CUDA,
``torch.cuda.nvtx`` calls (``nvtx``).  ``mstx_domain_include`` / ``mstx_domain_exclude``
(comma-separated names, never both) select domains; a filtered domain costs one dict lookup.

Iteration rule: a range (start/end or push/pop) belongs to the iteration in which it ENDS, with
its true start; when that start lies in an earlier iteration the record says which
(``si``, shown as ``Start Iteration`` in the timeline).  A marker belongs to the iteration it
happens in.  Iteration k spans (end of k-1, end of k]; whatever ended before the first
iteration ends goes into iteration 1.  Ranges still open at exit, and anything recorded after
the last finished iteration, are not written (the core drops unfinished iterations); the open
ones are named in a warning (stderr and ``info.json``'s ``jobprof.messages``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from jobprof.plugin import (
    JSON,
    Config,
    ExportContext,
    Iteration,
    PluginSession,
    Section,
    StreamsOut,
    WriterSpec,
    hookimpl,
)
from jobprof.plugins.msproftx import capture
from jobprof.plugins.msproftx.recorder import DomainFilter, Recorder
from jobprof.plugins.msproftx.report import marker_sections, rank_facts
from jobprof.plugins.msproftx.writer import NAME, STREAM, add_tracks, render_csv, render_json

if TYPE_CHECKING:
    from jobprof.plugin import Profile, Timeline

INCLUDE, EXCLUDE = "mstx_domain_include", "mstx_domain_exclude"
#: the session attribute holding the undo functions of the record_function / NVTX wrappers
_RESTORE = "msproftx.restore"


@hookimpl
def jobprof_options_schema() -> dict[str, Any]:
    domains = {"type": "string", "maxLength": 1024, "default": ""}
    return {
        "properties": {
            "msproftx": {"default": "off"},
            INCLUDE: {**domains, "description": "record only these marker domains (comma-separated, "
                      "e.g. \"default,record_function\"); excludes mstx_domain_exclude"},
            EXCLUDE: {**domains, "description": "record every marker domain but these "
                      "(comma-separated); excludes mstx_domain_include"},
        },
        # both set (non-empty) is an error: which one should win is not the user's intent
        "allOf": [{"description": f"{INCLUDE} and {EXCLUDE} cannot both be set: give the domains "
                                  "to record, or the domains to leave out",
                   "not": {"required": [INCLUDE, EXCLUDE],
                           "properties": {INCLUDE: {"minLength": 1}, EXCLUDE: {"minLength": 1}}}}],
    }


@hookimpl
def jobprof_configure(config: Config) -> bool:
    return config.is_on("msproftx")


@hookimpl
def jobprof_session_start(session: PluginSession) -> None:
    import torch

    config = session.config
    recorder = Recorder(DomainFilter.from_options(config.get(INCLUDE, ""), config.get(EXCLUDE, "")),
                        origin_ns=session.anchor.monotonic_ns, warn=session.reporter.warning)
    restores: list = []
    session.attach(_RESTORE, restores)
    session.attach(STREAM, recorder)  # jobprof.mstx finds it from now on
    capture.install(recorder, torch, restores)  # filled as it goes: a failure still undoes


@hookimpl
def jobprof_iteration_end(session: PluginSession, iteration: Iteration) -> StreamsOut:
    # built on the core's sink thread (take() selects by end time; threads only append)
    return {STREAM: partial(session.attached(STREAM).take, iteration.index, iteration.start_ns,
                            iteration.end_ns)}


@hookimpl
def jobprof_session_end(session: PluginSession) -> None:
    recorder = session.attached(STREAM)
    if recorder is None:
        return
    recorder.close()
    for restore in session.attached(_RESTORE) or ():
        restore()
    # a dynamic-mode capture ends mid-run: the job's ranges go on, and being open is no news
    for note in recorder.exit_notes(open_ranges=session.get_info("capture") is None):
        session.reporter.warning(note)


@hookimpl
def jobprof_writers(config: Config | None) -> list[WriterSpec]:
    return [
        WriterSpec(NAME, "csv", render_csv, "user markers: one row per mark / range (mstx, "
                   "record_function, NVTX)"),
        WriterSpec(NAME, "json", render_json, "user markers as Chrome-trace tracks per thread"),
    ]


@hookimpl
def jobprof_timeline(ctx: ExportContext, timeline: Timeline) -> None:
    add_tracks(ctx, timeline)


@hookimpl
def jobprof_rank_facts(profile: Profile, device: int) -> JSON:
    return rank_facts(profile, device)


@hookimpl
def jobprof_report_sections(profile: Profile) -> list[Section]:
    return marker_sections(profile)
