"""The built-in passes, registered by name on import, and pipeline text parsed into passes:
``parse_pipeline("a,b{x=1,y=foo},c")``."""
from __future__ import annotations

import dataclasses
import re

from . import (assign_layouts, assign_precision, autodiff_pass, builtin, fold_row_decay,  # noqa: F401
               narrow_broadcasts, narrow_checkpoints, narrow_reductions, partition,
               share_chunk_values, stable_reassociate, warp_specialize)
from .base import PASSES, ModulePass, PipelineSyntaxError, _format_value, option_rules
from .partition import _WORKSPACE_TYPES, PartitionPass
from .stable_reassociate import StableReassociatePass
from .warp_specialize import WarpSpecializePass

__all__ = ["PASSES", "make_pass", "parse_pipeline"]

# The allowed values of the built-in passes' options, checked when a pipeline is parsed
# (make_pass) rather than when the pass runs; the passes check them again.
PartitionPass.option_choices = {"workspace_dtype": ("auto", *_WORKSPACE_TYPES)}
WarpSpecializePass.option_min = {"depth": 1, "consumer_warpgroups": 1, "smem_budget": 0,
                                 "reserved_smem": 0, "producer_registers": 1,
                                 "consumer_registers": 1}
StableReassociatePass.option_min = {"max_exponent": 0, "subblock": 0, "diagonal_block": 0}


def make_pass(name: str, options: dict[str, str] | None = None) -> ModulePass:
    """Instantiate a registered pass from string options, checking names and types."""
    cls = PASSES.get(name)
    if cls is None:
        raise PipelineSyntaxError(f"unknown pass {name!r}; registered passes: {', '.join(sorted(PASSES))}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, raw in (options or {}).items():
        if key not in fields:
            valid = ", ".join(fields) or "none"
            raise PipelineSyntaxError(f"pass {name!r} has no option {key!r}; its options: {valid}")
        kwargs[key] = _coerce(raw, fields[key], name)
        _check_value(cls, fields[key], kwargs[key])
    return cls(**kwargs)


def _check_value(cls: type[ModulePass], field: dataclasses.Field, value) -> None:
    choices, least = option_rules(cls, field)
    if choices is not None and value not in choices:
        raise PipelineSyntaxError(
            f"pass {cls.name!r}: option {field.name}={_format_value(value)} is not allowed; "
            f"allowed values: {', '.join(_format_value(c) for c in choices)}")
    if least is not None and value < least:
        raise PipelineSyntaxError(
            f"pass {cls.name!r}: option {field.name}={_format_value(value)} is too small; "
            f"it must be >= {_format_value(least)}")


def parse_pipeline(text: str) -> list[ModulePass]:
    """Parse ``"a,b{x=1,y=foo},c"`` into pass instances (empty text: no passes)."""
    passes, pos, text = [], 0, text.strip()
    while pos < len(text):
        match = re.compile(r"\s*([A-Za-z0-9_-]+)\s*").match(text, pos)
        if not match:
            raise PipelineSyntaxError(f"pipeline: expected a pass name at offset {pos} in {text!r}")
        name, pos = match.group(1), match.end()
        options = {}
        if pos < len(text) and text[pos] == "{":
            end = text.find("}", pos)
            if end < 0:
                raise PipelineSyntaxError(f"pipeline: unclosed '{{' after {name!r} in {text!r}")
            for item in filter(None, (s.strip() for s in text[pos + 1:end].split(","))):
                key, sep, value = item.partition("=")
                if not sep:
                    raise PipelineSyntaxError(f"pipeline: option {item!r} of {name!r} needs KEY=VALUE")
                options[key.strip()] = value.strip()
            pos = end + 1
        passes.append(make_pass(name, options))
        while pos < len(text) and text[pos] in " ,":
            pos += 1
    return passes


def _coerce(raw: str, field: dataclasses.Field, pass_name: str):
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    kind = kind.removesuffix(" | None")      # None: the option is unset (the pass fills it in)
    try:
        if kind == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        return raw
    except ValueError:
        hint = " (true or false)" if kind == "bool" else ""
        raise PipelineSyntaxError(
            f"pass {pass_name!r}: option {field.name}={raw!r} is not a valid {kind}{hint}") from None
