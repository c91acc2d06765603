"""The value, record and result types under their old flat name.

Split by concern into :mod:`jobprof.plugin.values`, :mod:`jobprof.plugin.records` and
:mod:`jobprof.plugin.results`; a plugin imports them from :mod:`jobprof.plugin`.  This module
stays so that a plugin written against ``jobprof.plugin.types`` keeps working.
"""

from jobprof.plugin.records import *  # noqa: F403
from jobprof.plugin.records import __all__ as _records
from jobprof.plugin.results import *  # noqa: F403
from jobprof.plugin.results import __all__ as _results
from jobprof.plugin.values import *  # noqa: F403
from jobprof.plugin.values import __all__ as _values

__all__ = [*_values, *_records, *_results]
