"""Pass base class and the table of passes by kebab-case name (filled by ``register_pass``;
:mod:`kdagen.passes.registry` imports the built-in passes and parses pipeline text).

A pass is a dataclass whose fields are its options; ``name`` is a class attribute. Pipelines
refer to passes as ``name`` or ``name{opt=value,opt2=value}`` (mlir-opt style), so options are
data, and a pipeline is an ordered list of such specs.

Option values are checked when the pipeline text is parsed
(:func:`kdagen.passes.registry.make_pass`), not when the pass runs: the field's type
(bool/int/float/str), then the allowed values a pass declares in
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


def option_rules(cls: type[ModulePass], field: dataclasses.Field) -> tuple[tuple | None, float | None]:
    """(allowed values or None, least value or None) of a pass option."""
    choices = field.metadata.get("choices", cls.option_choices.get(field.name))
    least = field.metadata.get("min", cls.option_min.get(field.name))
    return (tuple(choices) if choices is not None else None), least


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
