"""Pass base class and the registry of passes by kebab-case name.

A pass is a dataclass whose fields are its options; ``name`` is a class attribute. Pipelines
refer to passes as ``name`` or ``name{opt=value,opt2=value}`` (mlir-opt style), so options are
data, and a pipeline is an ordered list of such specs.

Option values are checked when the pipeline text is parsed (:func:`make_pass`), not when the
pass runs: the field's type (bool/int/float/str), then the allowed values a pass declares in
``option_choices`` (option -> allowed values) and ``option_min`` (option -> least value), or
in a field's ``metadata`` (``choices``, ``min``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from .._mlir import ir

_KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class PassError(RuntimeError):
    """A pass could not do its job; the message says which op and why."""


class PipelineSyntaxError(ValueError):
    pass


class ModulePass:
    """Base of every pass: subclasses are dataclasses with a kebab-case ``name``."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    option_choices: ClassVar[dict[str, tuple]] = {}    # option -> allowed values
    option_min: ClassVar[dict[str, float]] = {}        # option -> least allowed value

    def run(self, module: ir.Module) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def spec(self) -> str:
        """The textual form that rebuilds this pass: ``name{opt=value,...}``."""
        opts = [f"{f.name}={_format_value(getattr(self, f.name))}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != _default_of(f)]
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


PASSES: dict[str, type[ModulePass]] = {}


def register_pass(cls: type[ModulePass]) -> type[ModulePass]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: a pass must be a dataclass (its fields are its options)")
    if not _KEBAB.match(getattr(cls, "name", "")):
        raise TypeError(f"{cls.__name__}: pass name {getattr(cls, 'name', None)!r} is not kebab-case")
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise TypeError(f"pass {cls.name!r} is registered twice ({PASSES[cls.name].__name__}, {cls.__name__})")
    PASSES[cls.name] = cls
    return cls


def make_pass(name: str, options: dict[str, str] | None = None) -> ModulePass:
    """Instantiate a registered pass from string options, checking names and types."""
    _load_builtin_passes()
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


def option_rules(cls: type[ModulePass], field: dataclasses.Field) -> tuple[tuple | None, float | None]:
    """(allowed values or None, least value or None) of a pass option."""
    choices = field.metadata.get("choices", cls.option_choices.get(field.name))
    least = field.metadata.get("min", cls.option_min.get(field.name))
    return (tuple(choices) if choices is not None else None), least


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


def _default_of(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce(raw: str, field: dataclasses.Field, pass_name: str):
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
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


def _load_builtin_passes() -> None:
    # Importing the package registers every pass module listed there.
    from . import registry  # noqa: F401
