"""PROFILING_OPTIONS: parse, compose the schema, validate, and build the frozen Config.

Policy (strict, like current msprof): any problem means the process runs unprofiled; every
problem is reported at once, each with its JSON path and the offending value.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import jsonschema

from jobprof import schemas
from jobprof.reporter import Problem
from jobprof.types import Config

#: msprof's option set when PROFILING_MODE=true and PROFILING_OPTIONS is empty or unset.
MSPROF_DEFAULT = {
    "output": "./",
    "training_trace": "on",
    "task_trace": "on",
    "hccl": "on",
    "aicpu": "on",
    "aic_metrics": "PipeUtilization",
    "msproftx": "off",
}
MAX_OPTIONS_BYTES = 2047
STORAGE_LIMIT_MIN_MB, STORAGE_LIMIT_MAX_MB = 200, 4294967295
CUSTOM_REGISTER_RANGE = (0x1, 0x6E)

_HINTS = {
    "storage_limit": "must be '<digits>MB' with no space and the unit, e.g. \"2048MB\"",
    "output": "must not contain control characters (\\n \\f \\r \\b \\t \\v) or DEL",
    "host_sys": "must be a comma list of cpu, mem, disk, network, osrt (no spaces)",
    "host_sys_usage": "must be a comma list of cpu, mem (no spaces)",
    "aic_metrics": "must be one of ArithmeticUtilization, PipeUtilization, Memory, MemoryL0, "
    "MemoryUB, ResourceConflictRatio, L2Cache, MemoryAccess, or Custom:<reg,...> (1-8 registers)",
}


@attrs.frozen
class Composed:
    """The run-time schema and which plugin collects each key."""

    schema: dict[str, Any]
    owners: Mapping[str, str]


@attrs.frozen
class Outcome:
    """Result of loading options: a Config, or the problems that prevent one."""

    config: Config | None
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()
    source: str = "PROFILING_OPTIONS"


def compose(fragments: Iterable[tuple[str, Mapping[str, Any]]]) -> Composed:
    """Merge the core schema with plugin fragments (``(plugin, fragment)`` pairs).

    A fragment that refines a core key is combined with ``allOf``; a new key is added.
    Raises ``jsonschema.SchemaError`` naming the plugin when a fragment is not a valid schema.
    """
    schema = copy.deepcopy(schemas.load("options"))
    owners: dict[str, str] = {}
    for plugin, fragment in fragments:
        try:
            jsonschema.Draft202012Validator.check_schema(dict(fragment))
        except jsonschema.SchemaError as exc:
            raise jsonschema.SchemaError(f"plugin '{plugin}': invalid options schema: {exc.message}") from None
        for key, sub in dict(fragment.get("properties", {})).items():
            core = schema["properties"].get(key)
            schema["properties"][key] = {"allOf": [core, sub]} if core is not None else dict(sub)
            owners.setdefault(key, plugin)
        schema.setdefault("allOf", []).extend(fragment.get("allOf", []))
    return Composed(schema, owners)


def defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The ``default`` of every property (looking inside ``allOf`` for refined keys)."""
    out = {}
    for key, sub in schema["properties"].items():
        for part in [sub, *sub.get("allOf", [])]:
            if "default" in part:
                out[key] = part["default"]
    return out


def read_text(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Return (options JSON text, source label) from the environment, msprof default if empty."""
    text = environ.get("PROFILING_OPTIONS", "")
    if not text.strip():
        return json.dumps(MSPROF_DEFAULT), "msprof default options (PROFILING_OPTIONS empty or unset)"
    return text, "PROFILING_OPTIONS"


def load(text: str, composed: Composed, source: str = "PROFILING_OPTIONS",
         cwd: str | None = None) -> Outcome:
    """Parse and validate ``text``; build the effective Config when there is no problem."""
    problems: list[Problem] = []
    warnings: list[str] = []
    size = len(text.encode("utf-8"))
    if size > MAX_OPTIONS_BYTES:
        problems.append(Problem("$", f"is {size} bytes; msprof accepts at most {MAX_OPTIONS_BYTES}"))
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        problems.append(Problem("$", f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"))
        return Outcome(None, tuple(problems), source=source)
    if not isinstance(options, dict):
        problems.append(Problem("$", f"must be a JSON object, not {_json_type(options)}", options, True))
        return Outcome(None, tuple(problems), source=source)

    validator = jsonschema.Draft202012Validator(composed.schema)
    for error in sorted(validator.iter_errors(options), key=lambda e: (list(e.absolute_path), e.message)):
        problems.extend(_explain(error, composed.schema, options))
    bad_keys = {p.path for p in problems}
    storage_mb = None
    if "storage_limit" in options and "$.storage_limit" not in bad_keys:
        storage_mb, msg, problem = _storage_limit(options["storage_limit"])
        warnings.extend(msg)
        problems.extend(problem)
    if isinstance(options.get("aic_metrics"), str) and "$.aic_metrics" not in bad_keys:
        problems.extend(_custom_registers(options["aic_metrics"]))
    if "$.output" not in bad_keys:
        problems.extend(_output_problems(str(options.get("output", "./")), cwd))
    if problems:
        return Outcome(None, tuple(problems), tuple(warnings), source)

    values = defaults(composed.schema)
    values.update({k: v for k, v in options.items() if v != "" or k in ("fp_point", "bp_point")})
    if options.get("task_time"):  # the newer name wins when both are set
        values["task_trace"] = options["task_time"]
    values.pop("task_time", None)
    if options.get("aic_metrics") == "":
        values["aic_metrics"] = "PipeUtilization"
    values["output"] = str(Path(cwd or os.getcwd(), values["output"]).resolve())
    config = Config(values, explicit=options.keys(), source=source, storage_limit_mb=storage_mb)
    return Outcome(config, (), tuple(warnings), source)


# -- explaining schema errors --------------------------------------------------------------
def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), "a value")


def _explain(error: jsonschema.ValidationError, schema: Mapping[str, Any],
             options: Mapping[str, Any]) -> list[Problem]:
    path = error.json_path
    key = error.absolute_path[0] if error.absolute_path else None
    if error.validator == "additionalProperties":
        known = list(schema["properties"])
        out = []
        for extra in sorted(set(error.instance) - set(known)):
            close = difflib.get_close_matches(extra, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(known))}"
            out.append(Problem(f"$.{extra}", f"unknown option key{hint}"))
        return out
    if error.validator == "not" and "instr_profiling_freq" in options:
        clash = [k for k in options if k in _EXCLUSIVE_WITH_INSTR]
        return [Problem("$.instr_profiling_freq",
                        f"cannot be combined with {', '.join(clash)} (msprof rule)")]
    if error.validator in ("allOf", "anyOf", "oneOf"):  # report the concrete sub-errors
        return [p for sub in error.context or [] for p in _explain(sub, schema, options)]
    value, has = error.instance, True
    if error.validator == "type":
        message = f"must be {_article(error.validator_value)}"
    elif error.validator == "enum":
        allowed = ", ".join(repr(v) for v in error.validator_value)
        message = f"must be one of {allowed}"
    elif error.validator == "pattern":
        message = _HINTS.get(str(key), f"must match {error.validator_value}")
    elif error.validator in ("minimum", "maximum"):
        bounds = _bounds(schema["properties"].get(key, {}))
        message = f"must be an integer in [{bounds[0]}, {bounds[1]}]"
    elif error.validator == "maxLength":
        message = f"must be at most {error.validator_value} characters"
        value = f"{len(error.instance)} characters"
    elif error.validator == "minLength":
        message = "must not be empty"
    else:
        message = error.message
    return [Problem(path, message, value, has)]


_EXCLUSIVE_WITH_INSTR = ("training_trace", "task_trace", "task_time", "hccl", "aicpu", "fp_point",
                         "bp_point", "aic_metrics", "l2", "runtime_api")


def _article(kind: Any) -> str:
    kinds = kind if isinstance(kind, list) else [kind]
    words = {"string": "a string", "integer": "an integer (a JSON number, not a string)",
             "object": "an object", "boolean": "true or false", "number": "a number"}
    return " or ".join(words.get(k, k) for k in kinds)


def _bounds(sub: Mapping[str, Any]) -> tuple[Any, Any]:
    for part in [sub, *sub.get("allOf", [])]:
        if "minimum" in part or "maximum" in part:
            return part.get("minimum"), part.get("maximum")
    return None, None


# -- checks JSON Schema cannot express -----------------------------------------------------
def _storage_limit(text: str) -> tuple[int | None, list[str], list[Problem]]:
    mb = int(text[:-2])
    if mb > STORAGE_LIMIT_MAX_MB:
        return None, [], [Problem("$.storage_limit",
                                  f"must be at most {STORAGE_LIMIT_MAX_MB}MB", text, True)]
    if mb < STORAGE_LIMIT_MIN_MB:
        return STORAGE_LIMIT_MIN_MB, [
            f"storage_limit {text!r} is below the minimum; using {STORAGE_LIMIT_MIN_MB}MB (as msprof does)"
        ], []
    return mb, [], []


def _custom_registers(text: str) -> list[Problem]:
    if not text.startswith("Custom:"):
        return []
    low, high = CUSTOM_REGISTER_RANGE
    out = []
    for reg in text[len("Custom:"):].split(","):
        number = int(reg, 16) if reg.lower().startswith("0x") else int(reg)
        if not low <= number <= high:
            out.append(Problem("$.aic_metrics", f"register {reg} is outside [0x1, 0x6E]", text, True))
    return out


def _output_problems(output: str, cwd: str | None) -> list[Problem]:
    """The output directory must be a directory, or creatable, and writable."""
    path = Path(cwd or os.getcwd(), output)
    probe = path
    while not probe.exists():  # nearest existing ancestor decides creatability
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == path else f"cannot be created: '{probe}' is a file"
        return [Problem("$.output", f"{what}", output, True)]
    if not os.access(probe, os.W_OK | os.X_OK) or _read_only_fs(probe):
        return [Problem("$.output", f"is not writable ('{probe}' does not allow writing)", output, True)]
    return []


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
