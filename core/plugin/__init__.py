"""The plugin API: everything a plugin imports from jobprof, in one place.

    from jobprof.plugin import ExportContext, WriterSpec, hookimpl

The hooks are specified in :mod:`jobprof.plugin.hookspec` (when each is called, what it
returns, an example); the names below are what those hooks receive and return.  Built-in plugins
import nothing else from jobprof (``tests/test_layout.py`` holds them to it, with a short named
allow-list of mechanisms that are not part of the contract), so a third-party plugin can do
everything a built-in one does.

* hooks: :data:`hookimpl`, :class:`Answer` (what a wrapper receives);
* values: :class:`Config`, :class:`Iteration`, :class:`ExportContext`, :class:`WriterSpec`,
  :class:`MetricSet`, :class:`PartSource`, :data:`NA`, :data:`STEP_MODE_MODEL_ID`; the types hooks
  are annotated with: :data:`Streams`, :data:`StreamsOut`, :data:`Spans`, :data:`JSON`;
* what a plugin reads and writes: :class:`PluginSession` (the running session),
  :class:`Profile` (a profile read back), :class:`Timeline` (the master timeline), the declared
  records of shared streams (:class:`CollectiveRecord`, ..., :func:`records_of`; :func:`decoded`
  reads any record type's raw rows), an ``ops``
  record (:class:`OpRecord`: ``r.name``, ``r.start``, ``r.dur``, ...), :class:`OpView` / :class:`Task` and the
  module :mod:`opview` (an iteration's operators as a tree, its tasks), :func:`assign_lanes`
  (overlapping spans on non-overlapping tracks), :mod:`opmath` (FLOPs and bytes of an operator);
* wrapping the program's calls: :func:`hide_frame` (a wrapper leaves no frame in the program's
  tracebacks), :func:`watch_blocks` (``record_function`` blocks as they open and end, no wrapper);
* records from other processes of the job (DataLoader workers, helpers): the module
  :mod:`channel` (an authenticated socket: ``channel.Receiver`` in the owner,
  ``channel.Sender.for_owner`` in a helper), imported on first use (``from jobprof.plugin import
  channel``), never when this package is;
* raw data read back (a plugin's tests): :func:`read_raw` (``(iteration, {stream: records})``
  of a device folder, in order);
* answers: :class:`Finding`, :class:`Section`, :class:`DiffTable`, :class:`DiffCount`, the
  span categories of the iteration breakdown (``DATA_WAIT``, ``COMPUTE``, ...).

Importing this package imports only the contract's own modules (no torch, no later stage).
"""

from jobprof.plugin import histogram, opmath, opview
from jobprof.plugin.blocks import BlockListener, Blocks
from jobprof.plugin.blocks import watch as watch_blocks
from jobprof.plugin.clock import ClockAnchor, TimeAxis
from jobprof.plugin.frames import hide_frame
from jobprof.plugin.hookspec import Answer, hookimpl
from jobprof.plugin.lanes import LANE_STRIDE, assign_lanes, lane_name, lane_tid
from jobprof.plugin.opview import OpView, Task, is_dispatch_op
from jobprof.plugin.rawread import read_raw
from jobprof.plugin.records import (
    CONCRETE,
    DEVICE_KINDS,
    ITERATION_STREAM,
    OP_MEMORY_STREAM,
    OPS_STREAM,
    PROFILER_STREAM,
    BatchRecord,
    CollectiveRecord,
    CompiledGraphRecord,
    FusedKernel,
    MemoryEvent,
    OpRecord,
    SharedRecord,
    StepPointsRecord,
    TxRecord,
    WorkerFetchRecord,
    decoded,
    records_of,
)
from jobprof.plugin.reporter import Reporter
from jobprof.plugin.results import (
    COMMUNICATION,
    COMMUNICATION_BLOCKING,
    COMPUTE,
    DATA_WAIT,
    FORWARD_BACKWARD,
    PROFILER,
    REFRESH,
    DiffCount,
    DiffTable,
    Finding,
    Section,
    slug,
)
from jobprof.plugin.session import PluginSession
from jobprof.plugin.timeline import (
    DEVICE_PROCESS,
    HOST_LABEL,
    SYNTHETIC_TID,
    Timeline,
    device_label,
    events_text,
    process_pid,
)
from jobprof.plugin.timeline import dumps as timeline_json
from jobprof.plugin.values import (
    JSON,
    NA,
    STEP_MODE_MODEL_ID,
    Config,
    ExportContext,
    Iteration,
    MetricSet,
    PartSource,
    Spans,
    Streams,
    StreamsOut,
    WriterSpec,
)
from jobprof.plugin.views import Profile

__all__ = [
    "COMMUNICATION",
    "COMMUNICATION_BLOCKING",
    "COMPUTE",
    "CONCRETE",
    "DATA_WAIT",
    "DEVICE_KINDS",
    "DEVICE_PROCESS",
    "FORWARD_BACKWARD",
    "HOST_LABEL",
    "ITERATION_STREAM",
    "JSON",
    "LANE_STRIDE",
    "NA",
    "OPS_STREAM",
    "OP_MEMORY_STREAM",
    "PROFILER",
    "PROFILER_STREAM",
    "REFRESH",
    "STEP_MODE_MODEL_ID",
    "SYNTHETIC_TID",
    "Answer",
    "BatchRecord",
    "BlockListener",
    "Blocks",
    "ClockAnchor",
    "CollectiveRecord",
    "CompiledGraphRecord",
    "Config",
    "DiffCount",
    "DiffTable",
    "ExportContext",
    "Finding",
    "FusedKernel",
    "Iteration",
    "MemoryEvent",
    "MetricSet",
    "OpRecord",
    "OpView",
    "PartSource",
    "PluginSession",
    "Profile",
    "Reporter",
    "Section",
    "SharedRecord",
    "Spans",
    "StepPointsRecord",
    "Streams",
    "StreamsOut",
    "Task",
    "TimeAxis",
    "Timeline",
    "TxRecord",
    "WorkerFetchRecord",
    "WriterSpec",
    "assign_lanes",
    "channel",
    "decoded",
    "device_label",
    "events_text",
    "hide_frame",
    "histogram",
    "hookimpl",
    "is_dispatch_op",
    "lane_name",
    "lane_tid",
    "opmath",
    "opview",
    "process_pid",
    "read_raw",
    "records_of",
    "slug",
    "timeline_json",
    "watch_blocks",
]


def __getattr__(name: str) -> object:
    # ``from jobprof.plugin import channel``: the socket channel imports socket, selectors,
    # secrets and tempfile, which no process should pay for at interpreter start (this package is
    # imported by every process with PROFILING_MODE=true); a plugin imports it when it opens one
    if name == "channel":
        import jobprof.plugin.channel

        return jobprof.plugin.channel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
