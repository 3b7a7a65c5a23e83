"""Running a pipeline of passes with the instrumentation of a compiler driver.

- every stage's IR can be kept (``keep_stages``) and dumped before/after chosen passes;
- ``time_passes`` records wall time per pass;
- on a failure the IR just before the failing pass is written to a file and the error names
  the pass and gives a one-line ``kdagen opt`` command that reproduces it.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TextIO

from .._mlir import ir
from .base import ModulePass, PipelineSyntaxError
from .registry import PASSES


class PassFailure(RuntimeError):
    def __init__(self, pass_spec: str, error: BaseException, reproducer: Path):
        self.pass_spec, self.error, self.reproducer = pass_spec, error, reproducer
        super().__init__(
            f"pass '{pass_spec}' failed: {error}\n"
            f"  IR before the pass: {reproducer}\n"
            f"  reproduce with: kdagen opt {reproducer} -p '{pass_spec}'")


@dataclass
class PipelineRun:
    stages: dict[str, str] = field(default_factory=dict)     # "<index>:<pass name>" -> IR after it
    timings: list[tuple[str, float]] = field(default_factory=list)

    def format_timings(self) -> str:
        total = sum(t for _, t in self.timings) or 1e-12
        lines = ["pass                              time (ms)      %"]
        for name, seconds in self.timings:
            lines.append(f"{name:<32} {seconds * 1e3:>10.2f} {100 * seconds / total:>6.1f}")
        lines.append(f"{'total':<32} {total * 1e3:>10.2f} {100.0:>6.1f}")
        return "\n".join(lines)


def reproducer_dir() -> Path:
    path = Path(os.environ.get("KDAGEN_REPRO_DIR") or tempfile.gettempdir())
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_pipeline(module: ir.Module, passes: list[ModulePass], *,
                 dump_before: tuple[str, ...] = (), dump_after: tuple[str, ...] = (),
                 dump_stream: TextIO | None = None, time_passes: bool = False,
                 keep_stages: bool = False,
                 on_stage: Callable[[str, ir.Module], None] | None = None) -> PipelineRun:
    """Run ``passes`` in order on ``module`` (in place). ``dump_before``/``dump_after``: pass
    names or ``all``; a name that is not a pass of ``passes`` raises PipelineSyntaxError
    (before anything runs)."""
    check_dump_names(passes, dump_before, dump_after)
    out = dump_stream or sys.stderr
    result = PipelineRun()
    for index, pass_ in enumerate(passes):
        before = str(module)
        if pass_.name in dump_before or "all" in dump_before:
            out.write(f"// -----// IR Dump Before {pass_.spec()} //----- //\n{before}\n")
        start = time.perf_counter()
        try:
            pass_.run(module)
            with module.context:
                if not module.operation.verify():
                    raise RuntimeError("the module does not verify after the pass")
        except Exception as err:  # any failure inside a pass is reported the same way
            path = reproducer_dir() / f"kdagen-repro-{pass_.name}-{os.getpid()}.mlir"
            path.write_text(before)
            raise PassFailure(pass_.spec(), err, path) from err
        elapsed = time.perf_counter() - start
        if time_passes:
            result.timings.append((pass_.name, elapsed))
        after = str(module) if (keep_stages or pass_.name in dump_after or "all" in dump_after) else None
        if after is not None and (pass_.name in dump_after or "all" in dump_after):
            out.write(f"// -----// IR Dump After {pass_.spec()} //----- //\n{after}\n")
        if keep_stages:
            result.stages[f"{index}:{pass_.name}"] = after
        if on_stage is not None:
            on_stage(pass_.name, module)
    return result


def check_dump_names(passes: list[ModulePass], dump_before=(), dump_after=()) -> None:
    """Raise PipelineSyntaxError for a dump request naming no pass of ``passes`` (the message
    lists the valid names); ``all`` is always valid."""
    running = list(dict.fromkeys(p.name for p in passes))
    for flag, names in (("--dump-before", dump_before), ("--dump-after", dump_after)):
        for name in names:
            if name == "all" or name in running:
                continue
            valid = ", ".join(["all", *running])
            if name in PASSES:
                raise PipelineSyntaxError(
                    f"{flag} {name}: the pipeline does not run {name}; valid names: {valid}")
            raise PipelineSyntaxError(
                f"{flag} {name}: unknown pass; valid names: {valid} "
                f"(registered passes: {', '.join(sorted(PASSES))})")
