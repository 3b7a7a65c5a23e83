"""The CLI with a user's gate file: list --gates, stability (every exponential with its proven
bound and proof), emit --gates errors, and the diagnostic for a gate that cannot be stable."""
from pathlib import Path

from click.testing import CliRunner

from kdagen.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "gates"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_list_shows_the_files_gates_with_range_and_parameters():
    res = run("list", "--gates", EXAMPLES / "kda_channel_rate.py")
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if l.startswith("kda_channel_rate"))
    assert "kda" in line and "[-8, 0]" in line and "rate [HV, K]" in line and "file" in line
    assert "softplus" in res.output and "built-in" in res.output


def test_stability_report_lists_every_exponential_with_its_bound_and_proof():
    res = run("stability", "kda_bwd", "--gates", EXAMPLES / "sq_sigmoid.py", "--gate",
              "sq_sigmoid")
    assert res.exit_code == 0, res.output
    head = res.output.splitlines()[0]
    assert "sq_sigmoid" in head and "declared range [-inf, 0]" in head
    n = int(head.split(": ")[1].split()[0])
    rows = [l for l in res.output.splitlines() if l.startswith("  ") and "|exponent| <=" in l]
    whys = [l for l in res.output.splitlines() if l.strip().startswith("why:")]
    assert n == len(rows) == len(whys) > 5
    assert any("decay_matmul" in l for l in rows) and any("decay_dot" in l for l in rows)
    # exp(A_log) with A_log unbounded is saturated, and says why
    assert any("saturated at 126" in l for l in rows)
    assert all(float(l.split("|exponent| <= ")[1].split()[0]) <= 126 for l in rows)
    assert "kernel kda_bwd" in res.output


def test_a_gate_that_cannot_be_stable_names_the_exp2_and_what_to_declare(tmp_path):
    path = tmp_path / "growing.py"
    path.write_text("from kdagen.ir.gate_math import sigmoid\n"
                    "from kdagen.ir.gates import define_gate\n"
                    "@define_gate('growing_gate', range=(-4.0, 4.0))\n"
                    "def growing_gate(g_raw, A_log, dt_bias):\n"
                    "    return 8.0 * sigmoid(g_raw + dt_bias) - 4.0\n")
    res = run("stability", "kda_fwd", "--gates", path, "--gate", "growing_gate")
    assert res.exit_code != 0
    assert "kda.exp2" in res.output and "exceeds" in res.output
    assert "|g| <= 1.365 per token" in res.output and "decaying gate" in res.output


def test_emit_gate_file_errors():
    res = run("emit", "--gates", "no/such/file.py", "-q")
    assert res.exit_code != 0 and "does not exist" in res.output
    res = run("emit", "--gates", EXAMPLES / "gdn_temperature.py", "--op", "kda", "-q",
              "--arch", "sm_90a")
    assert res.exit_code != 0 and "GDN gate" in res.output and "--op gdn" in res.output
