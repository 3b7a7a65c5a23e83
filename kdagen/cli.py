"""The `kdagen` command line: emit, inspect and verify kernels."""
from __future__ import annotations

import re
import sys

import click

from .table import format_table, plural


class _ArchList(click.ParamType):
    name = "ARCH[,ARCH...]"

    def convert(self, value, param, ctx):
        from .target import UnknownTargetError, parse_arch_list
        if not isinstance(value, str):
            return value
        try:
            return parse_arch_list(value)
        except UnknownTargetError as err:
            self.fail(str(err), param, ctx)


class _HeadDims(click.ParamType):
    name = "64|128[,...]"

    def convert(self, value, param, ctx):
        from .emit import head_dim_list
        try:
            return head_dim_list(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


class _KdagenGroup(click.Group):
    """Commands that need the compiler say how to install it, without a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as err:
            if not (err.name or "").startswith("numba_cuda_mlir"):
                raise
            raise click.ClickException(str(err)) from None


@click.group(cls=_KdagenGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kdagen")
def main():
    """kdagen: chunked gated-delta attention kernels (KDA, GDN) from a DSL, through MLIR, to PTX."""


TABLE_WIDTH = 100      # the default tables fit in this many columns


class _CliProgress:
    """Adapts the emit/check progress callbacks to a :class:`kdagen.table.Progress` on stderr."""

    def __init__(self, prefix: str, enabled: bool = True, check: bool = False):
        self.prefix, self.enabled, self.check, self.bar = prefix, enabled, check, None

    def __call__(self, event: str, **info) -> None:
        from .table import Progress
        if event == "steps":
            self.bar = Progress(info["total"], self.prefix, enabled=self.enabled)
        elif self.bar is None:
            return
        elif event == "lowering":
            verb = "assembling" if self.check else "lowering"
            self.bar.status(f"{verb} {info['program']} for {info['chip']}")
        elif event == "backend":
            from kdagen.codegen.backend_pool import compile_jobs
            self.bar.status(f"PTX + ptxas for {info['count']} kernels ({compile_jobs()} workers)")
        elif event == "lowered":
            self.bar.begin_step(info["count"])
        elif event == "kernel" and self.check:
            row = info["row"]
            self.bar.done(f"{row['chip']} {_cut(row['kernel'], 60)}: "
                          f"{'pass' if row['ok'] else 'FAIL'}")
        elif event == "kernel":
            row = info["row"]
            regs = f", {row['registers']} registers" if "registers" in row else ""
            self.bar.done(f"{row['chip']} {_short_program(row)} {row['short']}: "
                          f"{row['path']}{regs}")
        elif event == "step_done":
            self.bar.end_step()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _cut(text: str, width: int) -> str:
    from .table import _cut_middle
    return _cut_middle(text, width)


def _short_program(row: dict) -> str:
    opts = row.get("options") or {}
    if "head_k_dim" in opts:
        return f"{row['program']} K{opts['head_k_dim']}V{opts.get('head_v_dim', opts['head_k_dim'])}"
    return row["program"]


def _emit_table(rows: list[dict], verbose: bool) -> str:
    from .table import chip_rank
    rows = sorted(rows, key=lambda r: chip_rank(r["chip"]))   # stable: kernel order per chip
    if verbose:
        headers = ["kernel", "chip", "path", "registers", "spill stores", "spill loads",
                   "stack bytes", "smem bytes", "tile bytes", "tile storage", "est. us*"]
        table = [[r["kernel"], r["chip"], r["path"], r.get("registers", "-"),
                  r.get("spill_stores", "-"), r.get("spill_loads", "-"), r.get("stack_bytes", "-"),
                  r.get("dynamic_shared_memory", 0), r.get("tile_bytes", "-"),
                  r.get("storage", "-"), _cost_cell(r)] for r in rows]
        note = ("* static cost model's ESTIMATE, not a measurement: per chunk step for state "
                "scans (/step), per CTA otherwise (/CTA); counts in manifest.json \"cost\", "
                "`kdagen show PROGRAM --stage cost`")
        return format_table(headers, table) + "\n" + note
    headers = ["program", "K,V", "kernel", "chip", "path", "regs", "spill B", "smem B", "storage"]
    table = []
    for r in rows:
        opts = r.get("options") or {}
        kv = (f"{opts['head_k_dim']},{opts.get('head_v_dim', opts['head_k_dim'])}"
              if "head_k_dim" in opts else "-")
        spill = (r.get("spill_stores", 0) + r.get("spill_loads", 0)) if "registers" in r else "-"
        table.append([r["program"], kv, r.get("short", r["kernel"]), r["chip"], r["path"],
                      r.get("registers", "-"), spill, r.get("dynamic_shared_memory", 0),
                      r.get("storage", "-")])
    return format_table(headers, table, max_width=TABLE_WIDTH, shrink=2)


def _timing_line(t: dict) -> str:
    return (f"time: passes {t['passes']:.1f} s, lowering {t['lowering']:.1f} s, PTX (LLVM) "
            f"{t['llvm']:.1f} s + ptxas {t['ptxas']:.1f} s of work in {t['workers']} "
            f"worker(s): {t['backend_wall']:.1f} s; total {t['total']:.1f} s")


def _load_gate_files(files) -> list:
    """Load the user's gate files (``--gates``); their gates, in order."""
    if not files:
        return []
    from .ir.gates import GateFileError, load_gate_file
    out = []
    for path in files:
        try:
            out.extend(load_gate_file(path))
        except GateFileError as err:
            raise click.ClickException(f"--gates: {err}")
    return out


def _cost_cell(row: dict) -> str:
    if "cost_us" not in row:
        return "-"
    unit = "step" if row.get("cost_unit") == "chunk step" else row.get("cost_unit", "")
    return f"{row['cost_us']:.3g}/{unit}"


@main.command()
@click.option("-o", "--out", "out_dir", default="kdagen-out", show_default=True,
              type=click.Path(file_okay=False), help="Bundle folder to write.")
@click.option("--op", "op", default="all", show_default=True,
              type=click.Choice(["kda", "gdn", "all", "gate-cumsum"]),
              help="Programs to emit (forward + backward), or the foundation's gate+cumsum kernel.")
@click.option("--arch", "targets", default="sm_90a,sm_100a,sm_120a", show_default=True,
              type=_ArchList(), help="Comma-separated chips (or 'all').")
@click.option("--head-dim", "head_dims", default="128", show_default=True, type=_HeadDims(),
              help="Head dimension K = V (64, 128 or 256; at 256 the kernels take V = 128 "
                   "and the APIs run V = 256 in two value parts); several, comma-separated "
                   "(64,128), go into one bundle as one variant each.")
@click.option("--gate", default=None, help="Gate name (see `kdagen list`), or several "
              "comma-separated (one bundle holds each gate's kernels); default softplus (KDA) / "
              "gdn_softplus (GDN).")
@click.option("--gates", "gate_files", multiple=True, type=click.Path(dir_okay=False),
              help="A Python file of gates (define_gate) to load first; repeatable. "
                   "See examples/gates/.")
@click.option("--path", "path", default="native", show_default=True,
              type=click.Choice(["native", "portable"]),
              help="native: each chip's own path where kdagen has one (sm_90a: TMA producer "
                   "warpgroup + wgmma consumer), the portable one elsewhere; portable: mma.sync "
                   "+ FMA kernels valid on every chip. The table's path column says which each "
                   "kernel took.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print the full table: whole kernel names, spill stores and loads, stack and "
                   "tile bytes, the static cost model's estimate (also in the bundle's "
                   "manifest.json).")
@click.option("-q", "--quiet", is_flag=True, help="No progress report on stderr.")
@click.option("--dump-stages", "dump_dir", default=None, type=click.Path(file_okay=False),
              help="Also write every stage of every compilation (kda, each pass, gpu, ptx, "
                   "ptxas's report) to DIR/<variant>.<chip>/ (`kdagen show --stage` prints one).")
@click.option("--decode", is_flag=True,
              help="Also each op's decode program (kda_decode / gdn_decode: the per-token "
                   "recurrence, for kdagen.fused_recurrent_*), plain and on a state pool "
                   "(state_pool: the kernel reads and writes the slots of ssm_state_indices).")
@click.option("--residuals/--no-residuals", default=True, show_default=True,
              help="Also training's save_residuals pair of each op (the forward that saves the "
                   "chunk products its backward reads, what the API runs when a gradient is "
                   "needed: ~2% faster fwd+bwd). --no-residuals halves the fwd/bwd kernels; "
                   "training from such a bundle runs the plain pair.")
@click.option("--lower", "lower_options", multiple=True, metavar="KEY=VALUE",
              help="A lowering option over the defaults (kdagen.codegen.lower.options."
                   "LowerOptions), e.g. --lower load_batch=2 --lower "
                   "tensormap_params=grid_constant; repeatable.")
@click.option("--pipeline", default="chip", show_default=True,
              help="The pass pipeline: 'chip' (each chip's), or pass options over it, e.g. "
                   "'chip+kda-narrow-checkpoints{dtype=fp16}'.")
def emit(out_dir, op, targets, head_dims, gate, gate_files, path, verbose, quiet, dump_dir,
         decode, residuals, lower_options, pipeline):
    """Generate kernels for each chip into a bundle (manifest.json + .ptx/.cubin).

    The bundle replaces the one an earlier emit left in the folder (its kernel files that the
    new manifest does not list are removed; other files are kept). README.md in the bundle
    describes its files. Progress goes to stderr (a bar on a terminal, one line per kernel
    otherwise); the table of kernels to stdout."""
    from .emit import _resource_cells, emit_bundle, emit_programs, gate_cumsum_names
    from .table import chip_rank
    targets = sorted(targets, key=lambda t: chip_rank(t.chip))
    lower = _parse_lower(lower_options)
    if pipeline != "chip":
        lower["pipeline"] = _checked_pipeline(pipeline, targets)
    loaded = _load_gate_files(gate_files)
    if gate is None and loaded:
        gate = ",".join(g.name for g in loaded)
    if gate is not None and op == "all":
        op = "all"
    progress = _CliProgress("kdagen emit", enabled=not quiet)
    timing: dict = {}
    try:
        if op == "gate-cumsum":
            emitted = emit_bundle(out_dir, targets, head_dim=head_dims, progress=progress)
            rows = [dict(kernel=item.entry.name, chip=item.entry.chip, path=item.entry.path,
                         dynamic_shared_memory=item.entry.launch["dynamic_shared_memory"],
                         storage="registers", **gate_cumsum_names(item.entry.name),
                         **_resource_cells(item.entry)) for item in emitted]
            failed = [e for e in emitted if e.assembled is False]
        else:
            ops = ["kda", "gdn"] if op == "all" else [op]
            try:
                if gate is not None and op == "all":
                    from .ir.gates import get_gate
                    try:
                        ops = sorted({get_gate(n.strip()).family for n in gate.split(",")})
                    except ValueError as err:
                        raise click.ClickException(f"--gate: {err}")
                rows = emit_programs(out_dir, targets, ops, head_dim=head_dims, gate=gate,
                                     path=path, progress=progress, dump_dir=dump_dir,
                                     timing=timing, decode=decode, residuals=residuals,
                                     lower=lower)
            except ValueError as err:
                raise click.ClickException(str(err))
            failed = []
    finally:
        progress.close()
    for item in failed:
        click.echo(f"ptxas failed for {item.entry.name} on {item.entry.chip}:\n{item.log}",
                   err=True)
    click.echo(_emit_table(rows, verbose))
    if timing and not quiet:
        click.echo(_timing_line(timing), err=True)
    variants = len({r.get("variant", r["kernel"]) for r in rows})
    click.echo(f"wrote {plural(len(rows), 'kernel')} ({plural(variants, 'variant')}) to {out_dir}")
    if not verbose:
        click.echo("whole kernel names and ptxas resources: manifest.json (or emit --verbose)")
    if failed:
        sys.exit(1)


@main.command()
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-v", "--verbose", is_flag=True, help="Print whole kernel names.")
@click.option("-q", "--quiet", is_flag=True, help="No progress report on stderr.")
def check(bundle_dir, verbose, quiet):
    """Assemble every PTX of a bundle with ptxas for its chip (exit 1 on any failure).

    Progress goes to stderr (a bar on a terminal, one line per kernel otherwise)."""
    from .runtime.bundle import BundleError
    from .check import check_bundle
    from .codegen.ptxas import PtxasNotFound
    from .table import sort_chips
    progress = _CliProgress("kdagen check", enabled=not quiet, check=True)
    try:
        results = check_bundle(bundle_dir, progress=progress)
    except (PtxasNotFound, BundleError) as err:
        raise click.ClickException(str(err))
    finally:
        progress.close()
    click.echo(format_table(["kernel", "chip", "result", "detail"],
                            [[r.kernel, r.chip, "pass" if r.ok else "FAIL", r.detail]
                             for r in results],
                            max_width=None if verbose else TABLE_WIDTH, shrink=(0, 3)))
    passed = sum(r.ok for r in results)
    chips = sort_chips(r.chip for r in results if r.ok)
    click.echo(f"{passed}/{plural(len(results), 'kernel')} assembled "
               f"({', '.join(chips) or 'no chips'})")
    if passed != len(results) or not results:
        sys.exit(1)


@main.command(name="list")
@click.option("--options", "options", is_flag=True,
              help="List the program options (`kdagen show --option KEY=VALUE`) and the gates' "
                   "options instead.")
@click.option("--gates", "gate_files", multiple=True, type=click.Path(dir_okay=False),
              help="Also load the gates of this Python file (repeatable).")
def list_cmd(options, gate_files):
    """List the programs and gates kdagen knows."""
    from .ir import programs, gates
    loaded = {g.name for g in _load_gate_files(gate_files)}
    if options:
        click.echo(_program_options_text())
        return
    click.echo(format_table(["program", "description"], [list(r) for r in programs.list_programs()]))
    click.echo()
    rows = []
    for name, gate in gates.GATES.items():
        lo, hi = gate.output_range()
        params = ", ".join(f"{p} [{'HV' if k == 'scalar' else 'HV, K'}]"
                           for p, k in gate.params.items()) or "-"
        origin = "built-in" if gate.builtin else ("file" if name in loaded else "user")
        rows.append([name, gate.family, f"[{lo:g}, {hi:g}]", params, origin, gate.description])
    click.echo(format_table(["gate", "family", "declared range", "parameters", "from",
                             "description"], rows, max_width=TABLE_WIDTH, shrink=5))


def _program_option_rows() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(KEY=DEFAULT, meaning) of every program option, and of every gate option."""
    from .ir import gates, programs
    rows = [(f"{key}={_show_value(default)}", text)
            for key, (default, text) in programs.program_options().items()]
    by_option: dict[str, list] = {}
    for name, gate in gates.GATES.items():
        for key, default in gate.options.items():
            by_option.setdefault(key, []).append((name, default))
    gate_rows = []
    for key, uses in by_option.items():
        defaults = " or ".join(dict.fromkeys(_show_value(d) for _, d in uses))
        gate_rows.append((f"{key}={defaults}",
                          "taken by the gates " + ", ".join(n for n, _ in uses)))
    return rows, gate_rows


def _write_program_options(formatter) -> None:
    rows, gate_rows = _program_option_rows()
    with formatter.section("Program options (--option KEY=VALUE, default shown)"):
        formatter.write_dl(rows)
    with formatter.section("Gate options (--option KEY=VALUE with a gate that takes them)"):
        formatter.write_dl(gate_rows)


def _program_options_text() -> str:
    formatter = click.HelpFormatter(width=min(TABLE_WIDTH, 100))
    _write_program_options(formatter)
    return formatter.getvalue().rstrip("\n")


def _show_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return "none" if value is None else str(value)


class _ShowCommand(click.Command):
    """`kdagen show`: its help lists the --option keys (read from the programs)."""

    def format_epilog(self, ctx, formatter):
        super().format_epilog(ctx, formatter)
        try:
            _write_program_options(formatter)
        except Exception as err:  # noqa: BLE001 - help must print without MLIR too
            formatter.write_paragraph()
            formatter.write_text(f"(the program options cannot be listed here: {err}; "
                                 "see `kdagen list --options`)")


def _pipeline_options(fn):
    fn = click.option("--dump-before", multiple=True, metavar="PASS",
                      help="Print the IR before this pass ('all' for every pass).")(fn)
    fn = click.option("--dump-after", multiple=True, metavar="PASS",
                      help="Print the IR after this pass ('all' for every pass).")(fn)
    fn = click.option("--time-passes", is_flag=True, help="Report the time of each pass.")(fn)
    return fn


def _run_passes(module, passes, dump_before, dump_after, time_passes, keep_stages=False):
    from .passes.base import PipelineSyntaxError
    from .passes.pipeline import PassFailure, run_pipeline
    try:
        run = run_pipeline(module, passes, dump_before=tuple(dump_before),
                           dump_after=tuple(dump_after), time_passes=time_passes,
                           keep_stages=keep_stages)
    except (PassFailure, PipelineSyntaxError) as err:
        raise click.ClickException(str(err))
    if time_passes:
        click.echo(run.format_timings(), err=True)
    return run


@main.command(cls=_ShowCommand)
@click.argument("program")
@click.option("--stage", default="dsl", show_default=True,
              help="'dsl' (or 'kda': as the DSL built it), the name of a pass of the pipeline "
                   "(the IR right after it), 'final' (after the whole pipeline), 'gpu' (the "
                   "kernels in gpu/nvvm/llvm dialects), 'cost' (what each kernel executes per "
                   "chunk step or CTA, with a latency model's estimate), 'ptx' or 'cubin' "
                   "(ptxas's report).")
@click.option("--arch", default="sm_90a", show_default=True,
              help="Chip to compile for (its pipeline, lowering path, PTX).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Program option, e.g. --option chunk_size=64 --option gate=lower_bound "
                   "(the keys: below).")
@click.option("--gates", "gate_files", multiple=True, type=click.Path(dir_okay=False),
              help="Load the gates of this Python file first (then --option gate=NAME).")
@click.option("--lower", "lower_options", multiple=True, metavar="KEY=VALUE",
              help="A lowering option over the defaults, e.g. --lower load_batch=2 (what the "
                   "gpu, cost, ptx and cubin stages show under it); repeatable.")
@click.option("--cost-ops", default=12, show_default=True, type=click.IntRange(min=0),
              help="Program ops listed per kernel by the cost stage, the most instructions "
                   "first (0: every op).")
@click.option("--pipeline", default="chip", show_default=True,
              help="The pass pipeline: 'chip' (the chip's), or passes and options over it, "
                   "e.g. 'chip+kda-partition{out_crossing=true}'.")
@_pipeline_options
def show(program, stage, arch, options, gate_files, lower_options, cost_ops, pipeline,
         dump_before, dump_after, time_passes):
    """Print a program at a stage of its compilation (MLIR, PTX, ptxas's report).

    The stages are those of `kdagen emit` (the chip's pipeline, then the default lowering: the
    chip's native path where kdagen has one); the lowered stages print one section per kernel."""
    from .codegen.lower import cost_model
    # the cost stage's per-op table (a display choice: the kernels are the same), for this
    # command only
    saved, cost_model.BY_OP_TOP = cost_model.BY_OP_TOP, cost_ops or None
    try:
        _show(program, stage, arch, options, gate_files, lower_options, pipeline, dump_before,
              dump_after, time_passes)
    finally:
        cost_model.BY_OP_TOP = saved


def _show(program, stage, arch, options, gate_files, lower_options, pipeline, dump_before,
          dump_after, time_passes):
    from .driver import BACKEND_STAGES, DEFAULT_LOWERING, Compilation
    from .ir import programs
    from .passes.base import PipelineSyntaxError
    from .passes.pipeline import PassFailure
    from .target import UnknownTargetError
    known = [name for name, _ in programs.list_programs()]
    if program not in known:
        raise click.ClickException(f"unknown program {program!r}; choose one of "
                                   f"{', '.join(known)} (`kdagen list` describes them)")
    _load_gate_files(gate_files)
    try:
        comp = Compilation(program, _parse_options(options), arch, pipeline=pipeline,
                           lower=dict(DEFAULT_LOWERING, **_parse_lower(lower_options)),
                           dump_before=dump_before, dump_after=dump_after,
                           time_passes=time_passes)
    except UnknownTargetError as err:
        raise click.ClickException(f"--arch: {err}")
    except (PipelineSyntaxError, KeyError, ValueError) as err:
        raise click.ClickException(f"--pipeline {pipeline!r}: {err}")
    names = comp.pass_names()
    aliases = {"dsl": "kda", "final": names[-1] if names else "kda"}
    wanted = aliases.get(stage, stage)
    if wanted not in ("kda", *names, *BACKEND_STAGES):
        raise click.ClickException(
            f"--stage {stage}: not a stage of the {arch} compilation; choose dsl (or kda), "
            f"final, {', '.join(BACKEND_STAGES)} or a pass of the pipeline: "
            f"{', '.join(dict.fromkeys(names))}")
    try:
        comp.run(wanted)
    except KeyError as err:
        raise click.ClickException(str(err.args[0]) if err.args else repr(err))
    except (PassFailure, PipelineSyntaxError, ValueError, TypeError) as err:
        raise click.ClickException(str(err))
    if time_passes and comp.pass_run is not None:
        click.echo(comp.pass_run.format_timings(), err=True)
    click.echo(comp.output(wanted))


@main.command()
@click.argument("program")
@click.option("--gates", "gate_files", multiple=True, type=click.Path(dir_okay=False),
              help="Load the gates of this Python file first (repeatable).")
@click.option("--gate", default=None, help="The gate (default: the program's default gate).")
@click.option("--arch", default="sm_90a", show_default=True,
              help="Chip whose pipeline to run (the report names its kernels).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Program option (as `kdagen show`).")
def stability(program, gate_files, gate, arch, options):
    """Every exponential of PROGRAM's kernels: its proven bound, its guard and why.

    After the chip's whole pipeline (kda-stable-reassociate proves every exp2 and decay
    product in range, or stops with a diagnostic naming the exponential and what to declare).
    One section per kernel; each exponential with |exponent| <= its bound (an fp32 exp2 is
    exact to its rounding for |x| <= 126), the guard it needed and the proof."""
    from .driver import Compilation
    from .ir import programs
    from .ir.stability import stability_rows
    from .passes.base import PipelineSyntaxError
    from .passes.pipeline import PassFailure
    from .target import UnknownTargetError
    known = [name for name, _ in programs.list_programs()]
    if program not in known:
        raise click.ClickException(f"unknown program {program!r}; choose one of "
                                   f"{', '.join(known)}")
    _load_gate_files(gate_files)
    opts = _parse_options(options)
    if gate is not None:
        opts["gate"] = gate
    try:
        comp = Compilation(program, opts, arch, keep_stages=False).run_passes()
    except UnknownTargetError as err:
        raise click.ClickException(f"--arch: {err}")
    except (PassFailure, PipelineSyntaxError, ValueError, TypeError, KeyError) as err:
        raise click.ClickException(str(err))
    rows = stability_rows(comp.module)
    gate_name = comp.options.get("gate") or ("softplus" if program.startswith("kda")
                                             else "gdn_softplus")
    from .ir.gates import get_gate
    lo, hi = get_gate(gate_name).output_range(**{k: v for k, v in opts.items()
                                                  if k in get_gate(gate_name).options})
    click.echo(f"{program} with gate {gate_name} (declared range [{lo:g}, {hi:g}]) for {arch}: "
               f"{len(rows)} exponentials, all proven within fp32 range")
    kernel = None
    for r in rows:
        if r.kernel != kernel:
            kernel = r.kernel
            click.echo(f"\nkernel {kernel}:")
        click.echo(f"  {r.op:<13} {r.value:<16} [{r.shape}]  |exponent| <= {r.bound:g}  "
                   f"guard: {r.guard}")
        click.echo(f"      why: {r.proof}")


@main.command()
@click.argument("mlir_file", type=click.File("r"))
@click.option("-p", "--pipeline", default="", help="Passes to run, e.g. "
              "'kda-stable-reassociate,kda-partition{fuse=true}' (empty: parse, verify, print).")
@click.option("--no-verify-on-parse", is_flag=True,
              help="Do not check the kda shape rules when parsing (MLIR's own verifier still "
                   "runs), so that malformed input reaches the pipeline, e.g. to test that the "
                   "verify pass rejects it.")
@_pipeline_options
def opt(mlir_file, pipeline, no_verify_on_parse, dump_before, dump_after, time_passes):
    """Parse a kda-dialect MLIR file, run a pass pipeline on it, verify and print it."""
    from .ir.dialect import parse_module
    from .passes.base import PipelineSyntaxError
    from .passes.registry import parse_pipeline
    try:
        passes = parse_pipeline(pipeline)
    except PipelineSyntaxError as err:
        raise click.ClickException(f"-p: {err}")
    text = mlir_file.read()
    try:
        module = parse_module(text, check_shapes=not no_verify_on_parse)
    except Exception as err:  # the MLIR diagnostic is the useful part of any parse/verify error
        raise click.ClickException(f"{mlir_file.name}: {err}")
    restore_value_names(module, text)
    _run_passes(module, passes, dump_before, dump_after, time_passes)
    click.echo(_print(module))


_FILE_LOC = re.compile(r'^loc\("(?:[^"\\]|\\.)*":(\d+):(\d+)')
_RESULT_NAME = re.compile(r'(?:^|[\s(])%([A-Za-z_$.][\w$.-]*)(?::\d+)?\s*=\s*$')
_ARG_NAME = re.compile(r'%([A-Za-z_$.][\w$.-]*)')
_AUTO_NAME = re.compile(r'^arg\d+$')
_DEFINED_NAME = re.compile(r'%([A-Za-z_$.][\w$.-]*)(?::\d+)?\s*(?==|:)')
_DEDUP_SUFFIX = re.compile(r'^(.+)_\d+$')


def restore_value_names(module, text: str) -> None:
    """Give the values of a module parsed from ``text`` their SSA names as name locations.

    ``kdagen show`` prints the DSL's value names (name locations) as SSA names (%kd, %w...);
    the MLIR parser drops SSA names and gives every op a file:line:col location instead,
    which passes that name what they create after a value (kda-partition's workspaces
    ``<value>_ws``) would misread. Here each op result and block argument named in the text
    gets its name back as a name location (read at the position its location points to;
    ``<name>_<n>``, the printer's way to tell repeated names apart, becomes ``<name>`` again),
    every other op ``loc(unknown)``, as in a program the DSL built."""
    from .ir.dialect import ir
    lines = text.splitlines()
    defined = set(_DEFINED_NAME.findall(text))

    def position(loc):
        match = _FILE_LOC.match(str(loc))
        if not match:
            return None
        line, col = int(match.group(1)) - 1, int(match.group(2)) - 1
        return (lines[line], col) if 0 <= line < len(lines) else None

    def usable(name):
        return name is not None and not name.isdigit() and not _AUTO_NAME.match(name)

    def original(name):
        # the printer makes repeated names unique as <name>_<n>: the DSL's name is <name>
        match = _DEDUP_SUFFIX.match(name)
        return match.group(1) if match and match.group(1) in defined else name

    def arg_name(arg):
        pos = position(arg.location)
        if pos is None:
            return None
        match = _ARG_NAME.match(pos[0], pos[1])
        return match.group(1) if match else None

    def result_name(op):
        pos = position(op.location)
        if pos is None or len(op.results) == 0:
            return None
        match = _RESULT_NAME.search(pos[0][:pos[1]])
        return match.group(1) if match else None

    def visit(op):
        name = result_name(op)
        op.location = ir.Location.name(original(name)) if usable(name) else ir.Location.unknown()
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    name = arg_name(arg)
                    if usable(name):
                        arg.set_location(ir.Location.name(original(name)))
                    elif position(arg.location) is not None:
                        arg.set_location(ir.Location.unknown())
                for child in block.operations:
                    visit(child.operation)

    with module.context:
        visit(module.operation)


def _print(module) -> str:
    """MLIR text with the DSL's value names (%kd, %S, ...) as SSA names."""
    from .ir.dialect import print_module
    return print_module(module)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                "help_option_names": []})
@click.pass_context
def bench(ctx):
    """kdagen vs FLA on the GPU: median ms, ratio, % of roofline floor (table + JSON).

    Arguments pass through to the benchmark, e.g. `kdagen bench --ops kda --json out.json`;
    `kdagen bench --help` describes them all. Needs a CUDA GPU, fla-core and a kernel bundle."""
    from .benchmark import main as bench_main
    if any(a in ("-h", "--help", "--help-bench") for a in ctx.args):
        click.echo(bench_help())
        return
    sys.exit(bench_main(list(ctx.args)))


def bench_help() -> str:
    """`kdagen bench --help`: the benchmark's own argument help."""
    from .benchmark import build_parser
    return build_parser().format_help().rstrip("\n")


def _checked_pipeline(text: str, targets) -> str:
    """``--pipeline`` as the driver takes it, checked against each chip's pipeline (an
    actionable error naming the option otherwise)."""
    from .driver import validate_pipeline
    if not text.startswith("chip+"):
        raise click.BadParameter(f"{text!r}: use chip or chip+PASS{{KEY=VALUE}}",
                                 param_hint="--pipeline")
    for t in targets:
        try:
            validate_pipeline(text, t.chip)
        except Exception as err:   # noqa: BLE001 - the parser's message names the problem
            raise click.BadParameter(str(err), param_hint="--pipeline")
    return text


def _parse_lower(pairs) -> dict:
    """``--lower KEY=VALUE`` pairs as lowering options (an actionable error for a bad one)."""
    from .codegen.lower.options import parse_lower_option
    out = {}
    for pair in pairs:
        try:
            key, value = parse_lower_option(pair)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--lower")
        out[key] = value
    return out


def _parse_options(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--option")
        out[key.strip()] = _coerce(raw.strip())
    return out


def _coerce(raw: str):
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


if __name__ == "__main__":
    main()
