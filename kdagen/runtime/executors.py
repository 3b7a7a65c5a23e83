"""The executor registry: which :class:`Executor` runs a program on which device type.

The torch ops of :mod:`kdagen.ops` hand an executor a program name, the program options
(:func:`kdagen.ir.programs.program_options`), the inputs named like the program's arguments
(``q``, ``k``, ``v``, ``g``/``g_raw``, ``beta``/``beta_raw``, ``A_log``, ``dt_bias``,
``initial_state``, ``cu_seqlens``, ``scale``, ``do``, ``dht``) and the outputs it wants
(name -> :class:`OutSpec`: shape and dtype). It returns ``{name: tensor}`` on the inputs'
device, in the requested dtypes. An output of layout ``pool`` (a decode program's
``final_state`` with ``state_pool``) is not allocated: the caller passes the pool among the
inputs under the output's name, and the executor writes the rows of the sequences' slots
into it, in place (the same tensor as ``initial_state`` updates the pool in place).

Executors are chosen per device type (:func:`get_executor`); :func:`register_executor`
installs or replaces one: the runtime registers its bundle executor for ``cuda``, the compiler
registers its interpreter for ``cpu`` (:mod:`kdagen.compiler_hooks`), a test a double.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["OutSpec", "Executor", "register_executor", "get_executor", "executors",
           "freeze_options", "RecordingExecutor", "recording"]


@dataclass(frozen=True)
class OutSpec:
    """An output the caller wants: its shape and torch dtype."""
    shape: tuple
    dtype: Any  # torch.dtype (kept untyped so importing this module does not import torch)


def freeze_options(options: Mapping[str, Any]) -> tuple:
    """Program options as a hashable, order-independent tuple of (name, value) pairs."""
    out = []
    for name in sorted(options):
        value = options[name]
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = freeze_options(value)
        out.append((name, value))
    return tuple(out)


class Executor:
    """Runs a program on one device type. Subclasses implement :meth:`run`."""

    name = "executor"

    def run(self, program: str, options: Mapping[str, Any], inputs: Mapping[str, Any],
            outputs: Mapping[str, OutSpec]) -> dict:
        raise NotImplementedError


_REGISTRY: dict[str, Callable[[], Executor]] = {}   # registered by the user (or a test)
_DEFAULTS: dict[str, Callable[[], Executor]] = {}   # registered by the runtime and the compiler
_INSTANCES: dict[str, Executor] = {}
_REGISTRY_LOCK = threading.Lock()


def _factory(factory: Callable[[], Executor] | Executor) -> Callable[[], Executor]:
    return (lambda: factory) if isinstance(factory, Executor) else factory


def register_executor(device_type: str, factory: Callable[[], Executor] | Executor, *,
                      default: bool = False) -> None:
    """Use ``factory()`` (or an executor instance) for tensors on ``device_type``.

    ``default=True`` is how kdagen itself registers (the bundle executor, the compiler's
    interpreter): a default is used only where nothing was registered without it, so a
    user's executor (or :func:`recording`) wins whatever is imported later."""
    with _REGISTRY_LOCK:
        (_DEFAULTS if default else _REGISTRY)[device_type] = _factory(factory)
        _INSTANCES.pop(device_type, None)


def executors() -> dict[str, Callable[[], Executor]]:
    """device type -> executor factory in use (a copy)."""
    return {**_DEFAULTS, **_REGISTRY}


def get_executor(device) -> Executor:
    """The executor for a ``torch.device`` (or a device-type string)."""
    device_type = device if isinstance(device, str) else device.type
    with _REGISTRY_LOCK:
        inst = _INSTANCES.get(device_type)
        if inst is None:
            factory = _REGISTRY.get(device_type) or _DEFAULTS.get(device_type)
            if factory is None:
                raise RuntimeError(
                    f"kdagen has no executor for device type {device_type!r}; it runs on "
                    f"{sorted({**_DEFAULTS, **_REGISTRY})} (move the tensors with .to('cuda') "
                    f"or .cpu())")
            inst = _INSTANCES[device_type] = factory()
        return inst


class RecordingExecutor(Executor):
    """Runs nothing: records every (program, options) asked for and returns zeros of the
    requested outputs. Used by :func:`recording` to find the program variants a model needs
    (e.g. to emit one bundle holding all of them)."""

    name = "recording"

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def run(self, program, options, inputs, outputs):
        import torch
        self.calls.append((program, dict(options)))
        device = next((x.device for x in inputs.values() if isinstance(x, torch.Tensor)), "cpu")
        return {n: torch.zeros(s.shape, dtype=s.dtype, device=device) for n, s in outputs.items()}

    def variants(self) -> list[tuple[str, dict]]:
        """The distinct (program, options) recorded, in first-use order."""
        seen, out = set(), []
        for program, options in self.calls:
            key = (program, freeze_options(options))
            if key not in seen:
                seen.add(key)
                out.append((program, options))
        return out


@contextlib.contextmanager
def recording(device_type: str = "cpu"):
    """``with recording() as rec: <run the model on CPU tensors>`` — then
    ``rec.variants()`` lists the programs and options it needs (nothing is computed)."""
    rec = RecordingExecutor()
    old = _REGISTRY.get(device_type)
    register_executor(device_type, rec)
    try:
        yield rec
    finally:
        if old is None:
            with _REGISTRY_LOCK:
                _REGISTRY.pop(device_type, None)
                _INSTANCES.pop(device_type, None)
        else:
            register_executor(device_type, old)
