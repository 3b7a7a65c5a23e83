"""Run FileCheck (the `filecheck` package) on text, with CHECK lines given inline."""
import subprocess
import sys
import tempfile


def filecheck(text: str, checks: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".checks", delete=False) as f:
        f.write(checks)
        path = f.name
    proc = subprocess.run([sys.executable, "-m", "filecheck", path], input=text,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"FileCheck failed:\n{proc.stdout}{proc.stderr}"
