"""The Python examples reproduce TE-FL's examples and their expected log."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                        "python")


def run(name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TE_FL_", "TEFL_"))}
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True, env=env,
                       cwd=tempfile.gettempdir(), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, p.stderr


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="examples/python not in this tree")
def test_intree_example_log():
    out, err = run("example_intree.py")
    assert re.search(r"^\[TE-FL manager\.cpp:\d+ INFO\] Registered impl_ids: \['default\.portable', "
                     r"'reference\.cpp', 'vendor\.mybackend'\]$", err, re.M), err
    assert re.search(r"^\[TE-FL manager\.cpp:\d+ INFO\] Op 'rmsnorm_fwd' using 'vendor\.mybackend' "
                     r"\(kind=vendor, vendor=mybackend\)$", err, re.M), err
    assert "rmsnorm_fwd ran on 'vendor.mybackend'" in out
    assert float(re.search(r"max \|mybackend - reference.cpp\| = (\S+)", out).group(1)) < 1e-4


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="examples/python not in this tree")
def test_outtree_example_log():
    out, err = run("example_outtree.py")
    assert "Plugin 'my_vendor_plugin' (env) registered 1 implementation(s): [rmsnorm_fwd:vendor.myvendor]" in err
    assert re.search(r"Registered impl_ids: \['default\.portable', 'reference\.cpp', 'vendor\.myvendor'\]", err)
    assert "Op 'rmsnorm_fwd' using 'vendor.myvendor' (kind=vendor, vendor=myvendor)" in err
    assert "rmsnorm_fwd ran on 'vendor.myvendor'" in out


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="examples/python not in this tree")
def test_attention_fp8_example_trains_and_reports():
    out, err = run("example_attention_fp8.py")
    losses = [float(v) for v in re.findall(r"^step \d: loss (\S+)$", out, re.M)]
    assert len(losses) == 5 and losses[-1] < losses[0], out
    assert "generic_gemm -> default.portable, fused_attn_fwd -> default.portable" in out
    assert "get_attention_backend: (True, 'default.portable'" in out
    fp8, bf16 = map(float, re.search(r"relative error (\S+) \(bf16: (\S+)\)", out).groups())
    assert fp8 < 0.08 and bf16 < 0.01, out
