"""FileCheck tests of the passes on hand-written ``.mlir`` inputs (``tests/filecheck/``).

Each file tests one registered pass, independently of the DSL and of the passes before it
(xDSL's ``tests/filecheck``, Triton's ``test/TritonGPU``). The file's ``// RUN:`` lines are
shell commands (lit's syntax: ``%s`` is the input, ``kdagen``, ``filecheck`` and ``not`` the
tools; a trailing ``\\`` continues a RUN line). Lines ``// -----`` separate independent cases,
as with mlir-opt's ``--split-input-file``; this driver does the splitting:

* every case is written to a file of its own, at the line numbers it has in the test file
  (earlier lines left blank), so FileCheck's messages and the parser's locations point at the
  test file's lines;
* each RUN line runs on each case that has check lines for the RUN line's prefixes
  (``--check-prefix``/``--check-prefixes``, default ``CHECK``), with ``%s`` that case's file:
  the case's output is FileChecked against the case's own check lines, never another's. So
  an option variant (``--check-prefix=BF16``) or an expected error (``not kdagen ... 2>&1 |
  filecheck %s --check-prefix=ERR``) runs on the cases that check it. A case that no RUN
  line checks is an error.

``kdagen`` runs as ``{sys.executable} -m kdagen.cli`` with this checkout first on the path, so
the worktree's code runs (not an installed copy).

:func:`test_cases_fail_without_their_pass` runs every case again with its RUN line's pass
pipeline emptied (``-p ''``) and requires the check to fail, so every case checks something
its pass does; a case where the pass is meant to change nothing says why on a line
``// IDENTITY: <reason>`` and is exempt. A case that records a known bug (its checks state what
the pass should do) says so on a line ``// XFAIL: <reason>``: its RUN lines must fail, and
the test fails when they pass, so that the mark goes with the fix.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILECHECK_DIR = Path(__file__).resolve().parent / "filecheck"
FILES = sorted(FILECHECK_DIR.glob("*.mlir"))

SPLIT = re.compile(r"^\s*// -----\s*$")
RUN = re.compile(r"^\s*//\s*RUN:\s?(.*)$")
IDENTITY = re.compile(r"^\s*//\s*IDENTITY:\s*(\S.*)$")
XFAIL = re.compile(r"^\s*//\s*XFAIL:\s*(\S.*)$")
DIRECTIVE = r"(?:-NEXT|-NOT|-LABEL|-SAME|-DAG|-EMPTY|-COUNT-\d+)?"     # CHECK, CHECK-NEXT, ...
PIPELINE = re.compile(r"""(?<=\s)-p\s+'([^']*)'""")
PREFIX_OPTION = re.compile(r"--check-prefix(?:es)?(?:=|\s+)(\S+)")
TOOLS = {"kdagen": f"{shlex.quote(sys.executable)} -m kdagen.cli",
         "filecheck": f"{shlex.quote(sys.executable)} -m filecheck"}
# lit's `not`: succeed when the command fails
PRELUDE = "set -o pipefail\nnot() { ! \"$@\"; }\n"


@dataclass
class Case:
    index: int          # 1-based, in file order
    first_line: int     # 1-based line of the case's first line in the test file
    text: str           # the case, preceded by blank lines up to first_line

    def has_checks(self, prefixes: list[str]) -> bool:
        pattern = re.compile(r"//\s*(?:%s)%s:" % ("|".join(map(re.escape, prefixes)), DIRECTIVE))
        return bool(pattern.search(self.text))

    def _marker(self, pattern: re.Pattern) -> str | None:
        for line in self.text.splitlines():
            match = pattern.match(line)
            if match:
                return match.group(1)
        return None

    @property
    def identity(self) -> str | None:
        """Why the pass is meant to leave this case unchanged (``// IDENTITY: <reason>``)."""
        return self._marker(IDENTITY)

    @property
    def xfail(self) -> str | None:
        """The known bug that makes this case fail (``// XFAIL: <reason>``)."""
        return self._marker(XFAIL)


def run_lines(text: str) -> list[str]:
    out, pending = [], ""
    for line in text.splitlines():
        match = RUN.match(line)
        if not match:
            continue
        part = match.group(1).strip()
        if part.endswith("\\"):
            pending += part[:-1].rstrip() + " "
            continue
        out.append(pending + part)
        pending = ""
    assert not pending, f"a RUN line ends with '\\' and nothing follows: {pending!r}"
    return out


def split_cases(text: str) -> list[Case]:
    lines = text.splitlines()
    cases, start = [], 0
    for i, line in enumerate(lines + ["// -----"]):
        if SPLIT.match(line):
            body = "\n" * start + "\n".join(lines[start:i]) + "\n"
            cases.append(Case(len(cases) + 1, start + 1, body))
            start = i + 1
    return cases


def check_prefixes(run: str) -> list[str]:
    prefixes = []
    for value in PREFIX_OPTION.findall(run):
        prefixes += [p for p in value.split(",") if p]
    return prefixes or ["CHECK"]


def pipeline_of(run: str) -> str | None:
    match = PIPELINE.search(run)
    return match.group(1) if match else None


def substitute(run: str, path: Path) -> str:
    for tool, command in TOOLS.items():
        run = re.sub(rf"(?<![\w./%-]){tool}(?![\w./-])", lambda _: command, run)
    return run.replace("%s", shlex.quote(str(path)))


def execute(run: str, case: Case, work: Path) -> subprocess.CompletedProcess:
    path = work / f"case{case.index}.mlir"
    path.write_text(case.text)
    env = dict(os.environ, KDAGEN_REPRO_DIR=str(work / "repro"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run(["bash", "-c", PRELUDE + substitute(run, path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def checked_pairs(path: Path) -> list[tuple[str, Case]]:
    """(RUN line, case) for every case a RUN line checks; every case must be checked."""
    text = path.read_text()
    runs, cases = run_lines(text), split_cases(text)
    assert runs, f"{path.name}: no RUN lines"
    pairs = [(run, case) for run in runs for case in cases if case.has_checks(check_prefixes(run))]
    unchecked = [c for c in cases if not any(c is p[1] for p in pairs)]
    assert not unchecked, (f"{path.name}: case {unchecked[0].index} (line "
                           f"{unchecked[0].first_line}) has no check lines for any RUN line")
    return pairs


def _report(path: Path, run: str, case: Case, proc, work: Path) -> str:
    out = (proc.stdout + proc.stderr).replace(str(work / f"case{case.index}.mlir"),
                                              str(path.relative_to(ROOT)))
    return (f"{path.name}, case {case.index} (from line {case.first_line}), "
            f"RUN: {run}\nexit status {proc.returncode}\n{out}")


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_filecheck(path, tmp_path):
    failures = []
    for run, case in checked_pairs(path):
        proc = execute(run, case, tmp_path)
        if case.xfail and proc.returncode == 0:
            failures.append(f"{path.name}, case {case.index} (from line {case.first_line}), "
                            f"RUN: {run}\npassed but is marked XFAIL ({case.xfail}): the bug "
                            "is fixed? remove the XFAIL line")
        elif not case.xfail and proc.returncode != 0:
            failures.append(_report(path, run, case, proc, tmp_path))
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_cases_fail_without_their_pass(path, tmp_path):
    """Each case's checks fail when its RUN line runs no pass (-p ''): they check the pass."""
    passing = []
    for run, case in checked_pairs(path):
        pipeline = pipeline_of(run)
        assert pipeline, f"{path.name}: RUN line without -p '<pipeline>': {run}"
        if case.identity or case.xfail:
            continue
        proc = execute(PIPELINE.sub("-p ''", run, count=1), case, tmp_path)
        if proc.returncode == 0:
            passing.append(f"case {case.index} (from line {case.first_line}), RUN: {run}")
    assert not passing, (f"{path.name}: these checks also pass without the pass (check what it "
                         "does, or mark an intended no-op case '// IDENTITY: <reason>'):\n"
                         + "\n".join(passing))


def product_passes() -> dict:
    """The passes kdagen registers (other tests register passes of their own)."""
    from kdagen.passes.registry import PASSES   # importing it loads the built-in passes
    return {n: c for n, c in PASSES.items() if c.__module__.startswith("kdagen.")}


def test_every_registered_pass_has_a_filecheck_file():
    from kdagen.passes.registry import parse_pipeline
    PASSES = product_passes()
    assert PASSES
    missing = [name for name in sorted(PASSES) if not (FILECHECK_DIR / f"{name}.mlir").exists()]
    assert not missing, (f"passes without a FileCheck test: {', '.join(missing)} (add "
                         f"tests/filecheck/<pass>.mlir with RUN lines running the pass)")
    for name in PASSES:
        runs = run_lines((FILECHECK_DIR / f"{name}.mlir").read_text())
        ran = {p.name for run in runs for p in parse_pipeline(pipeline_of(run) or "")}
        assert name in ran, f"tests/filecheck/{name}.mlir: no RUN line runs {name}"


def test_every_filecheck_file_is_named_after_a_pass():
    PASSES = product_passes()
    strays = [p.name for p in FILES if p.stem not in PASSES]
    assert not strays, f"tests/filecheck files named after no registered pass: {strays}"


def test_split_keeps_line_numbers_and_checks_each_case_alone():
    text = "// RUN: x\n// CHECK: a\nA\n// -----\n// CHECK: b\nB\n  // -----  \nC\n"
    cases = split_cases(text)
    assert [c.first_line for c in cases] == [1, 5, 8]
    assert cases[1].text.splitlines()[4:] == ["// CHECK: b", "B"]
    assert cases[1].text.splitlines()[:4] == [""] * 4
    assert "a" not in cases[1].text and "b" not in cases[0].text
    assert [c.has_checks(["CHECK"]) for c in cases] == [True, True, False]
    assert check_prefixes("filecheck %s --check-prefix=ERR") == ["ERR"]
    assert check_prefixes("filecheck %s --check-prefixes=A,B") == ["A", "B"]
    assert check_prefixes("filecheck %s") == ["CHECK"]
    assert run_lines("// RUN: a \\\n// RUN:   b\n// RUN: c") == ["a b", "c"]
    assert substitute("not kdagen opt %s | filecheck %s", Path("/t/c.mlir")) == (
        f"not {TOOLS['kdagen']} opt /t/c.mlir | {TOOLS['filecheck']} /t/c.mlir")
