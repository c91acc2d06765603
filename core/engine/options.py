"""PROFILING_OPTIONS: parse, compose the schema, validate, and build the frozen Config.

Policy (strict, like current msprof): any problem means the process runs unprofiled; every
problem is reported at once, each with its JSON path and the offending value.
"""

from __future__ import annotations

import copy
import difflib
import errno
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs

from jobprof import schemas
from jobprof.engine import schemacheck
from jobprof.engine.schemacheck import SchemaProblem
from jobprof.plugin.reporter import Problem
from jobprof.plugin.values import Config

if TYPE_CHECKING:
    import jsonschema  # imported where an error is explained (jobprof.engine.schemacheck)

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
#: msprof's aic_metrics groups (docs/msprof.md section 1.2), answered by the built-in aic_metrics plugin
METRIC_GROUPS = ("PipeUtilization", "ArithmeticUtilization", "Memory", "MemoryL0", "MemoryUB",
                 "ResourceConflictRatio", "L2Cache", "MemoryAccess")
#: keys a plugin fragment may widen with ``{"enum": [...]}``: a third-party aic_metrics group
#: adds its name to the accepted values
WIDENED_KEYS = frozenset({"aic_metrics"})
MAX_OPTIONS_BYTES = 2047
STORAGE_LIMIT_MIN_MB, STORAGE_LIMIT_MAX_MB = 200, 4294967295
CUSTOM_REGISTER_RANGE = (0x1, 0x6E)
#: Nesting bound for the options JSON (the top-level object is level 1).  msprof's options are
#: flat; json.loads recurses once per level and raises RecursionError near 1,000 levels.
MAX_DEPTH = 32
#: Longest JSON integer taken: beyond every option's range, far below Python's int/str
#: conversion limit (4,300 digits), which json.loads hits as a bare ValueError.
MAX_INT_DIGITS = 64
#: Bytes kept free below PATH_MAX for what jobprof creates inside output
#: (PROF_<index>_<stamp>_<suffix>/device_<id>/timeline/<file>, and each file's temp name).
PROF_PATH_RESERVE = 256

#: Keys msprof refuses next to instr_profiling_freq when they are switched on (the schema's
#: dependentSchemas says the same; a test keeps them equal).
EXCLUSIVE_WITH_INSTR = ("training_trace", "task_trace", "task_time", "hccl", "aicpu", "fp_point",
                        "bp_point", "aic_metrics", "l2", "runtime_api")

_HINTS = {
    "storage_limit": "must be '<digits>MB' with no space and the unit, e.g. \"2048MB\"",
    "output": "must not contain control characters (\\n \\f \\r \\b \\t \\v, NUL) or DEL",
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

    A fragment that refines a core key is combined with ``allOf``; a new key is added; the
    fragment's ``$defs`` join the root's so its local ``$ref``s still resolve.
    Raises :class:`SchemaProblem` naming the plugin when a fragment is not a valid schema.
    """
    schema = copy.deepcopy(schemas.load("options"))
    owners: dict[str, str] = {}
    for plugin, fragment in fragments:
        try:
            problem = schemacheck.schema_error(fragment)
            if problem is not None:
                raise SchemaProblem(problem)
            if not isinstance(fragment, Mapping):
                raise SchemaProblem("must be an object")
            for name, sub in dict(fragment.get("$defs", {})).items():
                if schema["$defs"].setdefault(name, sub) != sub:
                    raise SchemaProblem(f"$defs/{name} is already defined differently")
        except SchemaProblem as exc:
            raise SchemaProblem(f"plugin '{plugin}': invalid options schema: {exc.message}") from None
        for key, sub in dict(fragment.get("properties", {})).items():
            core = schema["properties"].get(key)
            if key in WIDENED_KEYS and core is not None and set(sub) == {"enum"}:
                # a plugin adding a metric group widens the accepted names (anyOf), where any
                # other refinement narrows (allOf)
                schema["properties"][key] = {"anyOf": [core, dict(sub)]}
                continue
            schema["properties"][key] = {"allOf": [core, sub]} if core is not None else dict(sub)
            owners.setdefault(key, plugin)
        schema.setdefault("allOf", []).extend(fragment.get("allOf", []))
    return Composed(schema, owners)


def fragment_problem(fragment: Mapping[str, Any]) -> str | None:
    """What is wrong with one plugin's options-schema fragment, in a few words; None if nothing.

    The manager's contract check for ``jobprof_options_schema`` (the plugin is then failed with
    "returned <this>"): an invalid Draft 2020-12 schema, or ``$ref``s that resolve to nothing in
    the composed schema (jsonschema would only fail when the key is used, inside :func:`load`).
    """
    problem = schemacheck.schema_error(dict(fragment))
    if problem is not None:
        return f"an invalid JSON Schema: {problem}"
    dangling = _dangling_refs(fragment)
    if dangling:
        return f"a schema with $ref(s) that resolve to nothing: {', '.join(dangling)}"
    return None


def _dangling_refs(fragment: Mapping[str, Any]) -> list[str]:
    """``$ref``s of a fragment that do not resolve in the composed options schema."""
    core = schemas.load("options")
    merged = {**core, "$defs": {**core.get("$defs", {}), **dict(fragment.get("$defs", {}))},
              "properties": {**core.get("properties", {}), **dict(fragment.get("properties", {}))}}
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(fragment)
    out = []
    for ref in refs:
        pointer = ref[len(core.get("$id", "")):] if ref.startswith(core.get("$id", "#")) else ref
        if not pointer.startswith("#") or _resolve(merged, pointer[1:]) is _MISSING:
            out.append(ref)
    return sorted(set(out))


_MISSING = object()


def _resolve(document: Any, pointer: str) -> Any:
    """JSON Pointer (RFC 6901, URI-fragment form) lookup; _MISSING when it leads nowhere."""
    from urllib.parse import unquote

    node = document
    for part in pointer.split("/")[1:] if pointer else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _parts(sub: Any) -> Iterator[Mapping[str, Any]]:
    """A property schema and, recursively, its ``allOf`` parts (one per refining plugin)."""
    if isinstance(sub, Mapping):
        yield sub
        for part in sub.get("allOf", []):
            yield from _parts(part)


def defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The ``default`` of every property (looking inside ``allOf`` for refined keys)."""
    out = {}
    for key, sub in schema["properties"].items():
        for part in _parts(sub):
            if "default" in part:
                out[key] = part["default"]
    return out


def read_text(environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """Return (options JSON text, source label) from the environment, msprof default if empty."""
    text = environ.get("PROFILING_OPTIONS", "")
    if not text.strip():
        return (json.dumps(MSPROF_DEFAULT),
                "msprof default options (PROFILING_OPTIONS empty or unset)")
    return text, "PROFILING_OPTIONS"


class _NotJson(ValueError):
    """A construct Python's json accepts but JSON (and msprof's parser) does not."""


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


class _Unusable:
    """A JSON number Python cannot hold as written; reported at its path, never validated."""

    def __init__(self, text: str, reason: str) -> None:
        self.text, self.reason = text, reason

    def __repr__(self) -> str:  # show_value prints the digits the user wrote
        return self.text


def _parse_int(text: str) -> int | _Unusable:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        return _Unusable(text, f"integer has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float | _Unusable:
    number = float(text)
    if math.isinf(number):  # 1e400: Python would silently make it infinity
        return _Unusable(text, "number is too large (beyond a 64-bit float)")
    return number


#: strings (skipped whole, escapes included; an unterminated one runs to the end) and the
#: structural characters: enough to measure nesting without recursing
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)|[\[\]{}:]', re.DOTALL)


def _depth_problem(text: str) -> Problem | None:
    """A Problem when arrays/objects nest deeper than MAX_DEPTH, at the top-level key holding them.

    Measured on the text before json.loads runs, so no input can make the parser (or the schema
    validator after it) recurse past Python's limit.
    """
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None  # the usual case: too few brackets to nest that deep
    depth, top, key, last = 0, "", None, None
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            top = top or token
            if depth > MAX_DEPTH:
                path = f"$.{key}" if top == "{" and key is not None else "$"
                return Problem(path, f"is nested deeper than {MAX_DEPTH} levels of arrays and "
                                     "objects")
        elif token in ("]", "}"):
            depth -= 1
        elif token == ":" and depth == 1 and last is not None:
            try:
                key = json.loads(last)
            except ValueError:
                key = last[1:-1]
        last = token if depth == 1 and token.startswith('"') else None
    return None


def _parse(text: str, warnings: list[str]) -> Any:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                shown = repr(key if len(key) <= 80 else f"{key[:77]}...")  # keys may be any length
                warnings.append(f"option {shown} is given more than once; the last value is used")
            seen[key] = value
        return seen

    return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=pairs,
                      parse_int=_parse_int, parse_float=_parse_float)


def _encoding_message(text: str) -> str | None:
    """Why ``text`` cannot be written anywhere: a byte that is not UTF-8, or a lone surrogate."""
    found = re.search("[\ud800-\udfff]", text)
    if found is None:
        return None
    at = len(text[:found.start()].encode("utf-8"))
    code = ord(found.group())
    if 0xDC80 <= code <= 0xDCFF:  # how os.environ (and argv) hold an undecodable byte
        return f"is not valid UTF-8 at byte {at} (0x{code - 0xDC00:02x})"
    return f"contains a lone surrogate \\u{code:04x} at byte {at} (not valid Unicode)"


def _value_problems(value: Any, path: str = "$") -> Iterator[Problem]:
    """Numbers Python cannot hold and strings (keys too) that are not valid Unicode."""
    if isinstance(value, _Unusable):
        yield Problem(path, value.reason, value, True)
    elif isinstance(value, str):
        message = _encoding_message(value)
        if message:
            yield Problem(path, message, value, True)
    elif isinstance(value, dict):
        for key, item in value.items():
            message = _encoding_message(key)
            if message:
                yield Problem(f"{path}.{key}", f"key {message}", item, True)
            yield from _value_problems(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _value_problems(item, f"{path}[{index}]")


def _under(path: str, roots: set[str]) -> bool:
    return any(path == root or path.startswith((f"{root}.", f"{root}[")) for root in roots)


def load(text: str, composed: Composed, source: str = "PROFILING_OPTIONS",
         cwd: str | None = None) -> Outcome:
    """Parse and validate ``text``; build the effective Config when there is no problem.

    Never raises: whatever the text, the result is a Config or problems with JSON paths.
    """
    try:
        return _load(text, composed, source, cwd)
    except Exception as exc:  # a case the checks below missed: still a problem, never a crash
        reason = f"{type(exc).__name__}: {exc}"[:200]
        return Outcome(None, (Problem("$", f"could not be checked ({reason}); this is a jobprof "
                                           "bug, please report it"),), (), source)


def _load(text: str, composed: Composed, source: str, cwd: str | None) -> Outcome:
    problems: list[Problem] = []
    warnings: list[str] = []
    # surrogateescape: undecodable bytes in the environment must not crash the size check
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_OPTIONS_BYTES:
        problems.append(Problem("$", f"is {size} bytes long; msprof accepts at most "
                                     f"{MAX_OPTIONS_BYTES} bytes"))
    deep = _depth_problem(text)
    if deep is not None:
        return Outcome(None, tuple(_sorted([*problems, deep])), (), source)
    try:
        options = _parse(text, warnings)
    except json.JSONDecodeError as exc:
        problems.append(Problem(
            "$", f"invalid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}", text, True))
        return Outcome(None, tuple(problems), tuple(warnings), source)
    except _NotJson as exc:
        problems.append(Problem("$", f"invalid JSON: {exc}", text, True))
        return Outcome(None, tuple(problems), tuple(warnings), source)
    unusable = list(_value_problems(options))
    problems.extend(unusable)
    if not isinstance(options, dict):
        problems.append(Problem("$", f"must be a JSON object {{...}}, not {_json_type(options)}",
                                options, True))
        return Outcome(None, tuple(_sorted(problems)), tuple(warnings), source)

    flagged = {p.path for p in unusable}  # the schema's words about these values are noise
    problems.extend(p for p in _schema_problems(_errors(composed.schema, options), composed.schema, options)
                    if not _under(p.path, flagged) or p.message.startswith("unknown option key"))
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
        return Outcome(None, tuple(_sorted(problems)), tuple(warnings), source)

    values = defaults(composed.schema)
    values.update({k: v for k, v in options.items() if v != "" or k in ("fp_point", "bp_point")})
    if options.get("task_time"):  # the newer name wins when both are set
        values["task_trace"] = options["task_time"]
    values.pop("task_time", None)
    if options.get("aic_metrics") == "":
        values["aic_metrics"] = "PipeUtilization"
    if "instr_profiling_freq" in options:  # instruction profiling replaces the trace switches
        for key in EXCLUSIVE_WITH_INSTR:
            if options.get(key, "") == "" and values.get(key) not in (None, ""):
                values[key] = "off"
    for key, value in values.items():  # 10.0 passes "integer"; collectors get a real int
        if isinstance(value, float) and value.is_integer() and _declares(composed, key, "integer"):
            values[key] = int(value)
    if storage_mb is not None:
        values["storage_limit"] = f"{storage_mb}MB"  # the effective limit, after raising to 200
    values["output"] = str(Path(cwd or os.getcwd(), os.path.expanduser(values["output"])).resolve())
    config = Config(values, explicit=options.keys(), source=source, storage_limit_mb=storage_mb)
    return Outcome(config, (), tuple(warnings), source)


def _errors(schema: Mapping[str, Any], options: Mapping[str, Any]) -> list[jsonschema.ValidationError]:
    """jsonschema's errors, asked only when the fast check says the options are invalid."""
    if schemacheck.is_valid(schema, options):
        return []
    import jsonschema

    return list(jsonschema.Draft202012Validator(schema).iter_errors(options))


def _declares(composed: Composed, key: str, kind: str) -> bool:
    return any(part.get("type") == kind for part in _parts(composed.schema["properties"].get(key)))


def _sorted(problems: list[Problem]) -> list[Problem]:
    """Whole-document problems first, then by key; the same line is never repeated."""
    unique = {p.render(): p for p in problems}  # by text: values may be unhashable lists
    return sorted(unique.values(), key=lambda p: (p.path != "$", p.path))


# -- explaining schema errors --------------------------------------------------------------
def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), "a value")


#: When one key fails several keywords, only the most basic kind is reported: a wrong type
#: makes the enum/pattern errors of the same value noise.
_RANK = {"type": 0, "enum": 1, "const": 1, "pattern": 2, "minLength": 3, "maxLength": 3}


def _schema_problems(errors: list[jsonschema.ValidationError], schema: Mapping[str, Any],
                     options: Mapping[str, Any]) -> list[Problem]:
    best: dict[tuple[Any, ...], int] = {}
    for error in errors:
        where = tuple(error.absolute_path)
        best[where] = min(best.get(where, 99), _RANK.get(str(error.validator), 4))
    out: list[Problem] = []
    for error in errors:
        where = tuple(error.absolute_path)
        if where and _RANK.get(str(error.validator), 4) != best[where]:
            continue
        out.extend(_explain(error, schema, options))
    return out


def _explain(error: jsonschema.ValidationError, schema: Mapping[str, Any],
             options: Mapping[str, Any]) -> list[Problem]:
    path = error.json_path
    key = error.absolute_path[0] if error.absolute_path else None
    # a validator's errors always carry these; the stubs' Unset is for hand-built errors only
    instance: Any = error.instance
    validator_value: Any = error.validator_value
    value, has = instance, True
    if error.validator == "additionalProperties":
        # the options object itself, or an object-valued key (``trigger``): its own keys
        own: Any = error.schema
        nested = bool(error.absolute_path) and isinstance(own, Mapping)
        known = list((own if nested else schema)["properties"])
        where = path if nested else "$"
        out = []
        for extra in sorted(set(instance) - set(known)):
            lowered = {k.lower(): k for k in known}
            close = difflib.get_close_matches(extra.lower(), list(lowered), n=1, cutoff=0.6)
            hint = (f"did you mean \"{lowered[close[0]]}\"?" if close
                    else f"known keys: {', '.join(sorted(known))}")
            out.append(Problem(f"{where}.{extra}", f"unknown {'key' if nested else 'option key'}; {hint}",
                               instance[extra], True))
        return out
    if list(error.relative_schema_path)[:2] == ["dependentSchemas", "instr_profiling_freq"]:
        # the entries of the schema's anyOf that match name the keys that are switched on
        clash = [entry["required"][0] for entry in validator_value["anyOf"]
                 if schemacheck.is_valid(entry, options)]
        return [Problem("$.instr_profiling_freq",
                        f"cannot be combined with {', '.join(clash)} (msprof runs instruction "
                        "profiling alone; remove those keys or set them off)",
                        options["instr_profiling_freq"], True)]
    if error.validator in ("anyOf", "oneOf") and error.context:
        message = _alternatives(error, schema, options)
    elif error.validator == "required":
        missing = [k for k in validator_value if k not in instance]
        return [Problem(f"{path}.{k}", "is required here") for k in missing]
    elif error.validator == "type":
        message = _type_message(validator_value, instance)
    elif error.validator == "enum":
        message = _enum_message(validator_value)
    elif error.validator == "const":
        message = f"must be {json.dumps(validator_value)}"
    elif ((error.validator == "pattern" and str(key) in _HINTS)
          or (error.validator == "not" and key == "output")):  # output forbids characters
        message = _HINTS[str(key)]
    elif error.validator == "pattern":
        message = f"must match the pattern {validator_value}"
    elif (error.validator == "not" and not error.absolute_path and isinstance(error.schema, Mapping)
          and "description" in error.schema):  # a cross-key rule of a plugin, in its own words
        return [Problem("$", error.schema["description"])]
    elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        # a range keyword's schema is a mapping (a boolean schema has no keywords to fail)
        message = _range_message(schema["properties"].get(key),
                                 cast("Mapping[str, Any]", error.schema))
    elif error.validator == "maxLength":
        message = (f"must be at most {validator_value} characters long "
                   f"(this is {len(instance)})")
    elif error.validator == "minLength":
        message = ("must not be empty" if validator_value == 1
                   else f"must be at least {validator_value} characters long")
    else:
        message = error.message
    return [Problem(path, message, value, has)]


def _alternatives(error: jsonschema.ValidationError, schema: Mapping[str, Any],
                  options: Mapping[str, Any]) -> str:
    """anyOf/oneOf: what each alternative accepts, as one "must be A or B" sentence."""
    wanted: list[str] = []
    for sub in error.context or []:
        if sub.json_path != error.json_path:
            continue  # a deeper failure inside one alternative says less than its own rule
        if sub.validator == "type":
            wanted.append(_type_words(sub.validator_value))
        elif sub.validator in ("enum", "const"):
            allowed: Any = sub.validator_value  # set on a validator's errors (Unset: hand-built)
            values = allowed if sub.validator == "enum" else [allowed]
            wanted.append(" or ".join(json.dumps(v) for v in values))
        else:
            message = _explain(sub, schema, options)[0].message
            if not message.startswith("must be "):
                return error.message  # not expressible as one sentence: jsonschema's words
            wanted.append(message.removeprefix("must be "))
    return "must be " + " or ".join(dict.fromkeys(wanted)) if wanted else error.message


def _type_words(kind: Any) -> str:
    kinds: list[str] = kind if isinstance(kind, list) else [kind]
    words = {"string": "a string", "integer": "an integer", "object": "an object",
             "boolean": "true or false", "number": "a number", "array": "an array",
             "null": "null"}
    return " or ".join(words.get(k, k) for k in kinds)


def _type_message(kind: Any, instance: Any) -> str:
    kinds = kind if isinstance(kind, list) else [kind]
    message = f"must be {_type_words(kind)}"
    if isinstance(instance, str) and {"integer", "number"} & set(kinds):
        message += " (a JSON number, without quotes)"
    elif isinstance(instance, bool) and "string" in kinds:
        message += " (write switches as \"on\" or \"off\", in quotes)"
    if isinstance(instance, float) and not instance.is_integer():
        return message + ", not a fractional number"
    return message + f", not {_json_type(instance)}"


def _enum_message(allowed: list[Any]) -> str:
    shown = [json.dumps(v) for v in allowed if v != ""]
    text = shown[0] if len(shown) == 1 else f"one of {', '.join(shown)}"
    return f"must be {text}" + (" (or \"\" for the default)" if "" in allowed else "")


def _range_message(prop: Any, failed: Mapping[str, Any]) -> str:
    """The accepted range over every part of the key's schema (core and plugin refinements)."""
    low = high = None
    low_open = high_open = False
    for part in [*_parts(prop), failed]:
        for name, is_open in (("minimum", False), ("exclusiveMinimum", True)):
            if name in part and (low is None or part[name] >= low):
                low, low_open = part[name], is_open
        for name, is_open in (("maximum", False), ("exclusiveMaximum", True)):
            if name in part and (high is None or part[name] <= high):
                high, high_open = part[name], is_open
    integer = any(p.get("type") == "integer" for p in [*_parts(prop), failed])
    kind = "an integer" if integer else "a number"
    if low is not None and high is not None:
        return f"must be {kind} in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"must be {kind} {'>' if low_open else '>='} {low}"
    return f"must be {kind} {'<' if high_open else '<='} {high}"


# -- checks JSON Schema cannot express -----------------------------------------------------
def _storage_limit(text: str) -> tuple[int | None, list[str], list[Problem]]:
    digits = text[:-2].lstrip("0") or "0"
    # compare lengths first: int() refuses strings over 4300 digits
    if len(digits) > len(str(STORAGE_LIMIT_MAX_MB)) or int(digits) > STORAGE_LIMIT_MAX_MB:
        return None, [], [Problem("$.storage_limit", f"must be at most {STORAGE_LIMIT_MAX_MB}MB "
                                  f"(the range is [{STORAGE_LIMIT_MIN_MB}, "
                                  f"{STORAGE_LIMIT_MAX_MB}] MB)", text, True)]
    mb = int(digits)
    if mb < STORAGE_LIMIT_MIN_MB:
        return STORAGE_LIMIT_MIN_MB, [
            f"storage_limit {text!r} is below the minimum; "
            f"using {STORAGE_LIMIT_MIN_MB}MB (as msprof does)"
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
            out.append(Problem("$.aic_metrics", f"register {reg} is outside [0x1, 0x6E] "
                               f"(= [1, 110])", text, True))
    return out


def _output_problems(output: str, cwd: str | None) -> list[Problem]:
    """The output directory must be a directory, or creatable, and writable.

    Permission bits alone cannot tell (root passes os.access everywhere; /proc and /sys
    refuse new entries whatever the bits say), so a throw-away directory is created and
    removed in the nearest existing ancestor: exactly what creating PROF_* needs.  Name and
    path lengths are checked against that ancestor's file system first: ENAMETOOLONG would
    otherwise come only when the first iteration ends.
    """
    path = Path(os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(output))))  # ~/x
    probe = path
    while True:  # nearest existing ancestor decides creatability
        try:
            os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            if probe.is_symlink():
                return [Problem("$.output", f"cannot be created: '{probe}' is a broken symbolic "
                                            "link", output, True)]
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:  # EACCES on a folder above, ELOOP, ...
                return [Problem("$.output", f"cannot be checked: '{probe}' "
                                            f"({exc.strerror or type(exc).__name__})", output, True)]
        if probe.parent == probe:
            break
        probe = probe.parent
    too_long = _length_problems(path, probe, output)
    if too_long:
        return too_long
    if not probe.is_dir():
        what = "is a file, not a directory" if probe == path else (
            f"cannot be created: '{probe}' is a file, not a directory")
        return [Problem("$.output", what, output, True)]
    try:
        # a random name, as tempfile.mkdtemp makes (importing tempfile took 2 ms of start-up)
        made = probe / f".jobprof-write-probe-{os.getpid()}.{os.urandom(6).hex()}"
        os.mkdir(made, 0o700)
        os.rmdir(made)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return [Problem("$.output", f"is not writable: cannot create a directory in '{probe}' "
                                    f"({reason})", output, True)]
    return []


def _pathconf(where: Path, name: str, fallback: int) -> int:
    try:
        return os.pathconf(where, name)
    except (OSError, ValueError):
        return fallback


def _length_problems(path: Path, ancestor: Path, output: str) -> list[Problem]:
    """Folder names over NAME_MAX and a path over PATH_MAX (less what jobprof adds inside)."""
    name_max = _pathconf(ancestor, "PC_NAME_MAX", 255)
    path_max = _pathconf(ancestor, "PC_PATH_MAX", 4096)
    where = f"(os.pathconf of '{_shown_path(ancestor)}')"
    out = []
    for part in path.relative_to(ancestor).parts:  # the ancestor's own names exist already
        size = len(os.fsencode(part))
        if size > name_max:
            out.append(Problem("$.output", f"has a folder name of {size} bytes ({part[:20]}...), "
                                           f"longer than NAME_MAX {name_max} {where}",
                               output, True))
            break
    size = len(os.fsencode(str(path)))
    if size + PROF_PATH_RESERVE >= path_max:
        out.append(Problem("$.output", f"is {size} bytes long as an absolute path; with what "
                                       f"jobprof creates inside it (up to {PROF_PATH_RESERVE} "
                                       f"bytes) that is longer than PATH_MAX {path_max} {where}",
                           output, True))
    return out


def _shown_path(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-57:]}"
