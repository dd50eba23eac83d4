"""Non-contiguous inputs: handled (same result as the contiguous call) by ops
whose schema accepts strides, rejected with a clear error by ops whose schema
requires compact row-major tensors."""
import numpy as np
import pytest
import torch

import tefl
from tefl._ops import SCHEMAS
from opgen import as_np, has_fp8, make_call

OPS = sorted(s["name"] for s in SCHEMAS)


def _strided_copy(t):
    """The same values in a non-contiguous layout (every other column of a
    wider buffer)."""
    if isinstance(t, np.ndarray):
        wide = np.zeros(t.shape[:-1] + (2 * t.shape[-1],), t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


@pytest.mark.parametrize("lib", ["torch", "numpy"])
@pytest.mark.parametrize("op", OPS)
def test_strided_first_input(manager, op, lib):
    schema = tefl._ops.BY_NAME[op]
    if not manager.registry.get_implementations(op):
        pytest.skip(f"{op}: no implementation registered in this build")
    if lib == "numpy" and has_fp8(schema):
        pytest.skip("numpy has no float8 dtypes")
    kw, made = make_call(schema, "float32", lib)
    name = schema["inputs"][0]["name"]
    py = next(p for p, role, tgt in tefl._ops.SIGNATURES[op].params if role == "in" and tgt == name)
    strided = dict(kw)
    strided[py] = _strided_copy(kw[py])
    assert not (strided[py].flags["C_CONTIGUOUS"] if lib == "numpy" else strided[py].is_contiguous())
    if schema["contiguous"]:
        with pytest.raises(ValueError, match=rf"{op}: argument '{py}' \(input 0\): expected a contiguous "
                                             r"row-major tensor, got shape .* with strides"):
            manager.call(op, **strided)
        return
    want = manager.call(op, **kw)
    got = manager.call(op, **strided)
    for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        if a is not None:
            np.testing.assert_allclose(as_np(b), as_np(a), rtol=1e-6, atol=1e-6)


def test_negative_numpy_strides_rejected_clearly(manager):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)[:, ::-1]
    with pytest.raises(ValueError, match=r"strides \[8, -1\]"):
        manager.call("rmsnorm_fwd", x, np.ones(8, np.float32))


def test_outputs_keep_the_callers_layout_rules(manager):
    x, w = torch.randn(4, 8), torch.ones(8)
    bad_out = torch.empty(8, 4).t()
    with pytest.raises(ValueError, match=r"argument 'ln_out' \(output 0\): expected a contiguous"):
        manager.call("rmsnorm_fwd", x, w, 1e-5, bad_out)


def test_empty_tensors_with_torch_strides_are_accepted():
    # torch gives an empty [3, 0, 4] the strides (4, 4, 1) (is_contiguous() is
    # True); no element is addressed, so tefl takes it as compact.
    x = torch.empty(3, 0, 4)
    assert x.stride() == (4, 4, 1)
    assert tefl.gelu(x, None).shape == (3, 0, 4)
    assert tefl.swiglu(torch.empty(4, 0), None).shape == (4, 0)
    assert tefl.scaled_softmax_forward(torch.empty(2, 2, 3, 0), 1.0).shape == (2, 2, 3, 0)
    # GEMM with K = 0: the product is zero, bias and accumulate still apply.
    d = tefl.generic_gemm(torch.empty(5, 0), True, torch.empty(7, 0), False, bias=torch.arange(5.0))[0]
    torch.testing.assert_close(d, torch.arange(5.0).expand(7, 5))
    d = tefl.generic_gemm(torch.empty(5, 0), True, torch.empty(7, 0), False, D=torch.ones(7, 5), accumulate=True)[0]
    torch.testing.assert_close(d, torch.ones(7, 5))
    # N = 0: an empty D, allocated by tefl with torch's strides ([5, 0]: (1, 1)).
    assert tefl.generic_gemm(torch.empty(0, 16), True, torch.randn(5, 16), False)[0].shape == (5, 0)
