"""docs/ match the code: every path docs/ARCHITECTURE.md names exists, every registered pass
and every stage of the compile driver is described, and every citation of docs/*.md § in the
code points at a section that exists."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCH = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_every_path_the_architecture_names_exists():
    paths = set(re.findall(r"`((?:kdagen|tools|tests)/[\w./{},]*)`", ARCH))
    paths |= set(re.findall(r"\b((?:kdagen|tools|tests)/[\w/]+\.(?:py|md|mlir))", ARCH))
    assert paths
    missing = []
    for p in paths:
        p = p.rstrip("/")
        m = re.match(r"(.*)\{(.*)\}(.*)", p)
        options = [m.group(1) + part + m.group(3) for part in m.group(2).split(",")] if m else [p]
        for opt in options:
            if "<" in opt or not opt:
                continue
            if not (ROOT / opt).exists():
                missing.append(opt)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {sorted(missing)}"


def test_every_pass_and_stage_is_described():
    from kdagen.driver import BACKEND_STAGES
    from test_filecheck import product_passes
    undocumented = [name for name in product_passes() if name not in ARCH]
    assert not undocumented, f"passes missing from docs/ARCHITECTURE.md: {undocumented}"
    for stage in ("kda", *BACKEND_STAGES):
        assert f"`{stage}`" in ARCH, f"stage {stage} missing from docs/ARCHITECTURE.md"


def test_citations_of_the_docs_point_at_sections_that_exist():
    sections = {}
    for doc in (ROOT / "docs").glob("*.md"):
        sections[doc.name] = set(re.findall(r"^## (\d+)\.", doc.read_text(), flags=re.M))
    bad = []
    for path in [*ROOT.glob("kdagen/**/*.py"), *ROOT.glob("tools/*.py"), *ROOT.glob("tests/*.py"),
                 ROOT / "README.md"]:
        for doc, sec in re.findall(r"docs/(\w+\.md) §(\d+)", path.read_text()):
            if sec not in sections.get(doc, ()):
                bad.append(f"{path.relative_to(ROOT)}: docs/{doc} §{sec}")
        assert "DESIGN.md" not in path.read_text() or path.name == "test_docs.py", (
            f"{path.relative_to(ROOT)} cites DESIGN.md, which is not in the repository")
    assert not bad, f"citations of missing sections: {bad}"
