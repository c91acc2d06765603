"""``jobprof report``: the summary model as one self-contained HTML page (inline SVG charts,
tables, numbered findings with their evidence; nothing fetched from the network).

>>> from jobprof.report import render
>>> html = render(model)  # model = jobprof.summary.summarize(...) or `jobprof summary --json`
"""

from jobprof.report.page import render

__all__ = ["render"]
