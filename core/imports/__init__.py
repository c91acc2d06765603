"""``jobprof import``: torch.profiler (Kineto) trace files from any job turned into a jobprof profile.

The data flow, one module a stage::

    source.py       an untrusted trace file: opened (regular files only), decompressed, its
                    metadata read and its events streamed one at a time, each checked
    scan.py         pass 1 over the events: the ProfilerStep#N iterations, the launches'
                    correlation ids, the collectives' parameters, what was seen per category
    collectives.py  NCCL kernels (RCCL's on ROCm) as hccl's collective records
    build.py        pass 2: each event into its iteration's window file, one raw line per
                    iteration, the device folder's metadata, exactly as a live job writes them
    job.py          files grouped into ranks, every rank built into one staging PROF_ folder,
                    rendered by the ordinary export and renamed into place

Import writes the raw data a live CUDA job with ``training_trace`` + ``task_trace`` (+ ``hccl``
and ``msproftx`` where the trace holds them) writes, so everything downstream (export, summary,
report, diff, merge, kineto, the CANN 8 and per-rank exports) is the code a live job uses.
"""
