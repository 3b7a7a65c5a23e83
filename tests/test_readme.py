"""The README's two commands exist, and CI runs exactly the README's test command."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _code_lines():
    lines, inside = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside:
            lines.append(line.strip())
    return lines


def test_ci_runs_the_readme_test_command():
    commands = _code_lines()
    main_job, test_job = commands[0], commands[1]
    assert main_job.endswith("kdagen emit")
    assert "pytest" in test_job
    ci_lines = [l.strip() for l in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_job in ci_lines
