"""``jobprof report``: the summary model as one self-contained HTML page (inline SVG charts,
tables, numbered findings with their evidence; nothing fetched from the network).

>>> from jobprof.analysis.report import render
>>> html = render(model)  # model = jobprof.analysis.summary.summarize(...) or `jobprof summary --json`
"""

from jobprof.analysis.report.page import render

__all__ = ["render"]
