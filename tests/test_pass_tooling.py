"""Pass tooling: registry, option parsing, pipelines as data, dumps, timing, failure reproducers."""
import io
from dataclasses import dataclass, field

import pytest

from kdagen._mlir import ir
from kdagen.passes.base import PASSES, ModulePass, PassError, PipelineSyntaxError, register_pass
from kdagen.passes.registry import make_pass, parse_pipeline
from kdagen.passes.pipeline import PassFailure, run_pipeline
from kdagen.passes.pipelines import PIPELINES, pipeline_for

SOURCE = """
func.func @f(%a: f32) -> f32 {
  %c = arith.constant 1.0 : f32
  %0 = arith.mulf %a, %c : f32
  %1 = arith.mulf %0, %0 : f32
  %2 = arith.mulf %0, %0 : f32
  %3 = arith.addf %1, %2 : f32
  return %3 : f32
}
"""


@register_pass
@dataclass
class _TagPass(ModulePass):
    name = "test-tag"
    label: str = "x"
    times: int = 1
    loud: bool = False

    def run(self, module):
        with module.context:
            module.operation.attributes["test.tag"] = ir.StringAttr.get(self.label * self.times)


@register_pass
@dataclass
class _FailPass(ModulePass):
    name = "test-fail"

    def run(self, module):
        raise PassError("op 'arith.mulf' has no bounded form (bound 400.0 > 126)")


def module():
    ctx = ir.Context()
    return ir.Module.parse(SOURCE, ctx)


def test_parse_pipeline_with_options():
    passes = parse_pipeline("verify, test-tag{label=ab,times=3,loud=true},canonicalize{cse=false}")
    assert [p.name for p in passes] == ["verify", "test-tag", "canonicalize"]
    assert (passes[1].label, passes[1].times, passes[1].loud) == ("ab", 3, True)
    assert passes[1].spec() == "test-tag{label=ab,times=3,loud=true}"
    assert passes[2].cse is False
    assert parse_pipeline("") == []


@pytest.mark.parametrize("text,message", [
    ("no-such-pass", "unknown pass 'no-such-pass'; registered passes:"),
    ("test-tag{colour=red}", "has no option 'colour'; its options: label, times, loud"),
    ("test-tag{times=many}", "times='many' is not a valid int"),
    ("test-tag{times=2", "unclosed"),
    ("test-tag{times}", "needs KEY=VALUE"),
])
def test_pipeline_syntax_errors(text, message):
    with pytest.raises(PipelineSyntaxError, match=message.replace("(", r"\(").replace("{", r"\{")):
        parse_pipeline(text)


def test_registry_rejects_bad_names():
    with pytest.raises(TypeError, match="kebab-case"):
        @register_pass
        @dataclass
        class Bad(ModulePass):
            name = "Bad_Name"


def test_pipelines_are_registered_passes():
    for chip, names in PIPELINES.items():
        passes = pipeline_for(chip)
        assert len(passes) == len(names)
        assert all(p.name in PASSES for p in passes)
    with pytest.raises(ValueError, match="no pipeline for chip 'sm_80'"):
        pipeline_for("sm_80")


def test_run_pipeline_dumps_and_times():
    m = module()
    stream = io.StringIO()
    run = run_pipeline(m, parse_pipeline("test-tag{label=q},canonicalize"), dump_before=("test-tag",),
                       dump_after=("canonicalize",), dump_stream=stream, time_passes=True,
                       keep_stages=True)
    text = stream.getvalue()
    assert "IR Dump Before test-tag{label=q}" in text
    assert "IR Dump After canonicalize" in text
    assert list(run.stages) == ["0:test-tag", "1:canonicalize"]
    assert 'test.tag = "q"' in run.stages["0:test-tag"]
    # canonicalize + cse removed the x*1 and merged the duplicate multiply
    assert run.stages["1:canonicalize"].count("arith.mulf") == 1
    assert "arith.constant" not in run.stages["1:canonicalize"]
    assert [name for name, _ in run.timings] == ["test-tag", "canonicalize"]
    assert "total" in run.format_timings()


def test_failure_writes_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("KDAGEN_REPRO_DIR", str(tmp_path))
    m = module()
    with pytest.raises(PassFailure) as info:
        run_pipeline(m, parse_pipeline("test-tag{label=z},test-fail"))
    err = info.value
    message = str(err)
    assert "pass 'test-fail' failed: op 'arith.mulf' has no bounded form" in message
    assert f"kdagen opt {err.reproducer} -p 'test-fail'" in message
    assert err.reproducer.parent == tmp_path
    # the reproducer holds the IR just before the failing pass (after test-tag)
    assert 'test.tag = "z"' in err.reproducer.read_text()


@pytest.mark.parametrize("text,message", [
    ("kda-partition{workspace_dtype=fp8}",
     "option workspace_dtype=fp8 is not allowed; allowed values: auto, fp32, bf16, fp16"),
    ("kda-warp-specialize{depth=0}", "option depth=0 is too small; it must be >= 1"),
    ("kda-warp-specialize{consumer_warpgroups=-1}", "consumer_warpgroups=-1 is too small"),
    ("canonicalize{cse=maybe}", "cse='maybe' is not a valid bool (true or false)"),
])
def test_pass_option_values_are_checked_when_parsed(text, message):
    with pytest.raises(PipelineSyntaxError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_pipeline(text)


@register_pass
@dataclass
class _ChoicePass(ModulePass):
    name = "test-choice"
    mode: str = field(default="a", metadata={"choices": ("a", "b")})
    count: int = field(default=1, metadata={"min": 1})

    def run(self, module):
        pass


def test_pass_option_rules_from_field_metadata():
    assert parse_pipeline("test-choice{mode=b,count=2}")[0].mode == "b"
    with pytest.raises(PipelineSyntaxError, match="allowed values: a, b"):
        parse_pipeline("test-choice{mode=c}")
    with pytest.raises(PipelineSyntaxError, match="must be >= 1"):
        parse_pipeline("test-choice{count=0}")


@pytest.mark.parametrize("key", ["dump_before", "dump_after"])
def test_dump_names_must_name_a_pass_of_the_pipeline(key):
    passes = parse_pipeline("test-tag,canonicalize")
    with pytest.raises(PipelineSyntaxError, match="unknown pass; valid names: all, test-tag, canonicalize"):
        run_pipeline(module(), passes, **{key: ("nosuch",)})
    with pytest.raises(PipelineSyntaxError, match="does not run verify"):
        run_pipeline(module(), passes, **{key: ("verify",)})
    stream = io.StringIO()
    run_pipeline(module(), passes, dump_stream=stream, **{key: ("all",)})
    assert stream.getvalue().count("IR Dump") == 2
