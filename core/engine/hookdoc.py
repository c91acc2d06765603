"""``docs/hooks.md``, generated from the contract itself (``jobprof.plugin.hookspec``).

The hookspec's docstrings are the one place the contract is written (Markdown): the module's
docstring gives the sections around the hooks, each hook's docstring its own section, with the
signature as the spec declares it and the phase from the lifecycle table.  Run::

    python -m jobprof.engine.hookdoc > docs/hooks.md

``tests/test_docs.py`` fails when the page and the hookspec disagree.
"""

from __future__ import annotations

import inspect
import re
import sys
from types import FunctionType

from jobprof.plugin import hookspec

#: where the hooks' sections go in the module docstring: after this heading and its paragraph
HOOKS_HEADING = "## 3. The hooks"


def hooks() -> list[tuple[str, FunctionType]]:
    """The hook specifications, in the order the module defines them (lifecycle order)."""
    specs = []
    for name, fn in vars(hookspec).items():
        if name.startswith("jobprof_") and inspect.isfunction(fn):
            specs.append((name, fn))
    return sorted(specs, key=lambda item: item[1].__code__.co_firstlineno)


def phases(module_doc: str) -> dict[str, str]:
    """``hook name -> phase`` from the lifecycle table's rows (``| phase | `hook(...)` | ...``)."""
    out: dict[str, str] = {}
    for phase, hook in re.findall(r"^\| (\w+) \| `(jobprof_\w+)\(", module_doc, re.M):
        out.setdefault(hook, phase)
    return out


def heading(number: int, name: str, fn: FunctionType, phase: str) -> str:
    params = ", ".join(inspect.signature(fn).parameters)
    first = " (firstresult)" if getattr(fn, "jobprof_spec", {}).get("firstresult") else ""
    return f"3.{number} `{name}({params})` — {phase}{first}"


def render() -> str:
    """The whole page."""
    module_doc = inspect.cleandoc(hookspec.__doc__ or "")
    title, _, rest = module_doc.partition("\n\n")
    before, found, after = rest.partition(HOOKS_HEADING)
    if not found:
        raise ValueError(f"the hookspec's docstring has no {HOOKS_HEADING!r} section")
    intro, _, after = after.partition("\n## ")
    found_phases = phases(module_doc)
    sections = []
    for number, (name, fn) in enumerate(hooks(), 1):
        doc = inspect.cleandoc(fn.__doc__ or "")
        signature = f"def {name}{inspect.signature(fn)}"
        sections.append(f"### {heading(number, name, fn, found_phases.get(name, 'other'))}\n\n"
                        f"```python\n{signature}\n```\n\n{doc}\n")
    return (f"<!-- generated from core/plugin/hookspec.py by `python -m jobprof.engine.hookdoc`: "
            f"edit the docstrings there, not this page -->\n"
            f"# Plugin hooks reference\n\n{title}\n\n{before}{HOOKS_HEADING}{intro}\n\n"
            + "\n".join(sections) + f"\n## {after}\n")


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
