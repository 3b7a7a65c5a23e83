"""The `kdagen` command line: emit, inspect and verify kernels."""
from __future__ import annotations

import sys

import click

from .table import format_table


class _ArchList(click.ParamType):
    name = "ARCH[,ARCH...]"

    def convert(self, value, param, ctx):
        from .codegen.target import UnknownTargetError, parse_arch_list
        if not isinstance(value, str):
            return value
        try:
            return parse_arch_list(value)
        except UnknownTargetError as err:
            self.fail(str(err), param, ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kdagen")
def main():
    """kdagen: chunked gated-delta attention kernels (KDA, GDN) from a DSL, through MLIR, to PTX."""


@main.command()
@click.option("-o", "--out", "out_dir", default="kdagen-out", show_default=True,
              type=click.Path(file_okay=False), help="Bundle folder to write.")
@click.option("--op", "op", default="all", show_default=True,
              type=click.Choice(["kda", "gdn", "all", "gate-cumsum"]),
              help="Programs to emit (forward + backward), or the foundation's gate+cumsum kernel.")
@click.option("--arch", "targets", default="sm_90a,sm_100a,sm_120a", show_default=True,
              type=_ArchList(), help="Comma-separated chips (or 'all').")
@click.option("--head-dim", default="128", show_default=True, type=click.Choice(["64", "128"]),
              help="Head dimension K = V.")
@click.option("--gate", default=None, help="Gate name (see `kdagen list`); default softplus "
              "(KDA) / gdn_softplus (GDN).")
@click.option("--path", "path", default="native", show_default=True,
              type=click.Choice(["native", "portable"]),
              help="native: each chip's own path where kdagen has one (sm_90a: TMA producer "
                   "warpgroup + wgmma consumer), the portable one elsewhere; portable: mma.sync "
                   "+ FMA kernels valid on every chip. The table's path column says which each "
                   "kernel took.")
def emit(out_dir, op, targets, head_dim, gate, path):
    """Generate kernels for each chip into a bundle (manifest.json + .ptx/.cubin)."""
    from .emit import emit_bundle, emit_programs
    if op == "gate-cumsum":
        emitted = emit_bundle(out_dir, targets, head_dim=int(head_dim))
        rows = []
        for item in emitted:
            res = item.entry.resources or {}
            rows.append(dict(kernel=item.entry.name, chip=item.entry.chip, path=item.entry.path,
                             registers=res.get("registers", "-"),
                             spill_stores=res.get("spill_stores", 0),
                             spill_loads=res.get("spill_loads", 0),
                             dynamic_shared_memory=item.entry.launch["dynamic_shared_memory"],
                             storage="registers"))
        failed = [e for e in emitted if e.assembled is False]
        for item in failed:
            click.echo(f"ptxas failed for {item.entry.name} on {item.entry.chip}:\n{item.log}",
                       err=True)
    else:
        ops = ["kda", "gdn"] if op == "all" else [op]
        try:
            rows = emit_programs(out_dir, targets, ops, head_dim=int(head_dim), gate=gate,
                                 path=path)
        except ValueError as err:
            raise click.ClickException(str(err))
        failed = []
    table = [[r["kernel"], r["chip"], r["path"], r.get("registers", "-"),
              r.get("spill_stores", 0) + r.get("spill_loads", 0) if "registers" in r else "-",
              r.get("dynamic_shared_memory", 0), r.get("storage", "-")] for r in rows]
    click.echo(format_table(["kernel", "chip", "path", "registers", "spill bytes", "smem bytes",
                             "tile storage"], table))
    click.echo(f"wrote {len(rows)} kernels to {out_dir}")
    if failed:
        sys.exit(1)


@main.command()
@click.argument("bundle_dir", type=click.Path(exists=True, file_okay=False))
def check(bundle_dir):
    """Assemble every PTX of a bundle with ptxas for its chip (exit 1 on any failure)."""
    from .bundle import BundleError
    from .check import check_bundle
    from .codegen.ptxas import PtxasNotFound
    try:
        results = check_bundle(bundle_dir)
    except (PtxasNotFound, BundleError) as err:
        raise click.ClickException(str(err))
    click.echo(format_table(["kernel", "chip", "result", "detail"],
                            [[r.kernel, r.chip, "pass" if r.ok else "FAIL", r.detail] for r in results]))
    passed = sum(r.ok for r in results)
    chips = sorted({r.chip for r in results if r.ok})
    click.echo(f"{passed}/{len(results)} kernels assembled ({', '.join(chips) or 'no chips'})")
    if passed != len(results) or not results:
        sys.exit(1)


@main.command(name="list")
def list_cmd():
    """List the programs and gates kdagen knows."""
    from .ir import programs, gates
    click.echo(format_table(["program", "description"], [list(r) for r in programs.list_programs()]))
    click.echo()
    click.echo(format_table(["gate", "description"], [list(r) for r in gates.list_gates()]))


def _pipeline_options(fn):
    fn = click.option("--dump-before", multiple=True, metavar="PASS",
                      help="Print the IR before this pass ('all' for every pass).")(fn)
    fn = click.option("--dump-after", multiple=True, metavar="PASS",
                      help="Print the IR after this pass ('all' for every pass).")(fn)
    fn = click.option("--time-passes", is_flag=True, help="Report the time of each pass.")(fn)
    return fn


def _run_passes(module, passes, dump_before, dump_after, time_passes, keep_stages=False):
    from .passes.pipeline import PassFailure, run_pipeline
    try:
        run = run_pipeline(module, passes, dump_before=tuple(dump_before),
                           dump_after=tuple(dump_after), time_passes=time_passes,
                           keep_stages=keep_stages)
    except PassFailure as err:
        raise click.ClickException(str(err))
    if time_passes:
        click.echo(run.format_timings(), err=True)
    return run


@main.command()
@click.argument("program")
@click.option("--stage", default="dsl", show_default=True,
              help="'dsl' (as the DSL built it), 'final' (after the whole pipeline) or the name of "
                   "a pass of the pipeline (the IR right after it).")
@click.option("--arch", default="sm_90a", show_default=True, help="Chip whose pipeline to run.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Program option, e.g. --option chunk_size=64 --option gate=lower_bound.")
@_pipeline_options
def show(program, stage, arch, options, dump_before, dump_after, time_passes):
    """Print a program's MLIR at a stage of its pipeline."""
    from .ir import programs
    from .passes.base import PipelineSyntaxError
    from .passes.pipelines import pipeline_for
    try:
        module = programs.build_program(program, **_parse_options(options))
        passes = [] if stage == "dsl" else pipeline_for(arch)
    except (KeyError, ValueError, TypeError, PipelineSyntaxError) as err:
        raise click.ClickException(str(err))
    if stage not in ("dsl", "final"):
        names = [p.name for p in passes]
        if stage not in names:
            raise click.ClickException(f"--stage {stage}: not a pass of the {arch} pipeline; "
                                       f"choose dsl, final or one of: {', '.join(names)}")
        passes = passes[:len(names) - names[::-1].index(stage)]
    _run_passes(module, passes, dump_before, dump_after, time_passes)
    click.echo(_print(module))


@main.command()
@click.argument("mlir_file", type=click.File("r"))
@click.option("-p", "--pipeline", default="", help="Passes to run, e.g. "
              "'kda-stable-reassociate,kda-partition{fuse=true}' (empty: parse, verify, print).")
@_pipeline_options
def opt(mlir_file, pipeline, dump_before, dump_after, time_passes):
    """Parse a kda-dialect MLIR file, run a pass pipeline on it, verify and print it."""
    from .ir.dialect import parse_module
    from .passes.base import PipelineSyntaxError, parse_pipeline
    try:
        passes = parse_pipeline(pipeline)
    except PipelineSyntaxError as err:
        raise click.ClickException(f"-p: {err}")
    try:
        module = parse_module(mlir_file.read())
    except Exception as err:  # the MLIR diagnostic is the useful part of any parse/verify error
        raise click.ClickException(f"{mlir_file.name}: {err}")
    _run_passes(module, passes, dump_before, dump_after, time_passes)
    click.echo(_print(module))


def _print(module) -> str:
    """MLIR text with the DSL's value names (%kd, %S, ...) as SSA names."""
    from .ir.dialect import print_module
    return print_module(module)


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def bench(ctx):
    """kdagen vs FLA on the GPU: median ms, ratio, % of roofline floor (table + JSON).

    Arguments pass through to the benchmark, e.g. `kdagen bench --ops kda --json out.json`
    (`kdagen bench --help-bench` lists them). Needs a CUDA GPU, fla-core and a kernel bundle."""
    from .benchmark import main as bench_main
    args = ["--help" if a == "--help-bench" else a for a in ctx.args]
    sys.exit(bench_main(args))


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
