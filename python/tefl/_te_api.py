"""TransformerEngine's call conventions for GEMM and attention, on tefl's ops.

- ``generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias,
  bias_type, gelu, gelu_in, grad, workspace, workspace_size, accumulate,
  use_split_accumulator)`` -> ``(out, bias_grad, gelu_input, extra_output)``:
  TE states GEMMs in cuBLAS column-major terms; tefl's ``generic_gemm`` op is
  row-major. A column-major ``D = op(A) op(B)`` over row-major torch tensors is
  the row-major ``D = op(B) op(A)`` with the same transpose flags, so this
  function calls the op with A and B (and their flags) swapped
  (docs/ops-gemm.md has the table). FP8 operands are TE ``Float8Tensor``-like
  objects (``_data``, ``_scale_inv``) or float8 torch tensors with
  ``A_scale_inv=`` / ``B_scale_inv=``; an FP8 output comes from a quantizer
  (``scale``, ``amax``, ``dtype``).
- ``get_attention_backend(attention_params)`` -> TE's 6-tuple, from tefl's
  resolution of ``fused_attn_fwd`` for those parameters.
- ``flash_attention`` / ``FlashAttention``: TE's attention module contract
  (built with ``softmax_scale, attention_type=, layer_number=,
  deterministic=, attention_dropout=, attention_dropout_ctx=``; called with
  q, k, v and the layout/mask arguments) running ``fused_attn_fwd`` and, with
  autograd, ``fused_attn_bwd``.
"""
from __future__ import annotations

import math
import numbers
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ._types import DType, dtype_name

# ---- FP8 tensors and quantizers --------------------------------------------------------

_FP8_NAMES = {DType.kFloat8E4M3: "float8_e4m3fn", DType.kFloat8E5M2: "float8_e5m2"}


@dataclass
class Float8Tensor:
    """FP8 data with its dequantization scale (TE's Float8Tensor fields)."""

    _data: Any  # a float8 torch tensor (or uint8 view)
    _scale_inv: Any  # [1] float32
    _fp8_dtype: DType = DType.kFloat8E4M3

    @property
    def shape(self):
        return self._data.shape

    def dequantize(self, dtype=None):
        from . import dequantize as _dequantize  # the catalogue op

        out = _dequantize(_fp8_codes(self, "Float8Tensor.dequantize"), self._scale_inv)
        return out if dtype is None else out.to(dtype)


@dataclass
class Float8Quantizer:
    """Per-tensor (delayed or current) scaling parameters of an FP8 output:
    ``scale`` [1] f32 (input), ``amax`` [1] f32 (written: max |x| before
    scaling), ``dtype`` (DType.kFloat8E4M3 or kFloat8E5M2)."""

    scale: Any
    amax: Any
    dtype: DType = DType.kFloat8E4M3

    def __post_init__(self):
        # A bad dtype is named here, when the quantizer is made, not at the
        # first op that uses it.
        _quantizer_dtype(self, "Float8Quantizer")


def _amax_into(quantizer, amax):
    """quantizer.amax = max(quantizer.amax, amax): TE's kernels fold each
    cast's max |x| into the quantizer's amax (an atomic max), and its
    delayed-scaling recipe zeroes that amax when it rolls the history, so
    that one step's casts (micro-batches, recomputation) all count. NaN
    propagates, as in tefl's amax outputs."""
    dst = quantizer.amax
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dst, torch.Tensor):
        with torch.no_grad():
            torch.maximum(dst, amax, out=dst)
        return
    import numpy as np

    np.maximum(dst, amax, out=dst)


def _fp8_codes(x, where: str):
    """A Float8Tensor's codes as a float8 tensor. TE's own Float8Tensor keeps
    them as uint8 (``_data``) with the format in ``_fp8_dtype``; those are
    viewed as that float8 dtype (no copy)."""
    data = x._data
    if dtype_name(getattr(data, "dtype", None)) != "uint8":
        return data
    fmt = getattr(x, "_fp8_dtype", None)
    try:
        name = _FP8_NAMES[DType(int(getattr(fmt, "value", fmt)))]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: a Float8Tensor with uint8 data needs _fp8_dtype DType.kFloat8E4M3 or "
                         f"kFloat8E5M2 to read its codes, got {fmt!r}") from None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return data.view(getattr(torch, name))
    try:
        import ml_dtypes  # numpy's float8 types
    except ImportError:
        raise TypeError(f"{where}: uint8 Float8Tensor data in a {type(data).__name__} cannot be read as {name} "
                        f"without ml_dtypes; pass a torch tensor or float8 data") from None
    return data.view(getattr(ml_dtypes, name))


def _gemm_operand(x, what: str):
    """x, checked to be a 2-D tensor (or Float8Tensor), in the caller's terms."""
    if x is None:
        raise TypeError(f"generic_gemm: argument '{what}' is required, got None")
    data = x._data if hasattr(x, "_data") and hasattr(x, "_scale_inv") else x  # a Float8Tensor's codes
    shape = getattr(data, "shape", None)
    if shape is None or not hasattr(data, "dtype"):
        raise TypeError(f"generic_gemm: argument '{what}' must be a 2-D tensor (torch, numpy or Float8Tensor), "
                        f"got {type(x).__name__}")
    if len(shape) != 2:
        raise ValueError(f"generic_gemm: argument '{what}' must be a 2-D tensor, got shape {list(shape)}")
    return x


def _is_row_major(t) -> bool:
    if hasattr(t, "is_contiguous"):
        return bool(t.is_contiguous())
    flags = getattr(t, "flags", None)
    return bool(flags.c_contiguous) if flags is not None else True


def _check_gemm_operands(A, a, transA, B, b, transB):
    """The operand checks whose C++ messages would name the swapped row-major
    operands (the row-major call's A is TE's B): made here, in TE's names."""
    k_b = a.shape[0] if transB else a.shape[1]
    k_a = b.shape[1] if transA else b.shape[0]
    if k_a != k_b:
        raise ValueError(f"generic_gemm: A {list(A.shape)} (transA={bool(transA)}) and B {list(B.shape)} "
                         f"(transB={bool(transB)}) have different inner dimensions: K = {k_a} from A, {k_b} from B")
    da, db = dtype_name(b.dtype), dtype_name(a.dtype)
    if da != db and not (da.startswith("float8") and db.startswith("float8")):
        raise ValueError(f"generic_gemm: A is {da} and B is {db}; expected the same dtype (or two FP8 operands)")
    for what, t in (("A", b), ("B", a)):
        if not _is_row_major(t):
            raise ValueError(f"generic_gemm: argument '{what}' must be contiguous (row-major), got a non-contiguous "
                             f"view of shape {list(t.shape)} (for a transposed operand pass the untransposed tensor "
                             f"and trans{what}=True)")


def _fp8_operand(x, scale_inv, what: str):
    """(tensor, scale_inv) of a GEMM operand."""
    if hasattr(x, "_data") and hasattr(x, "_scale_inv"):
        return _fp8_codes(x, f"generic_gemm: argument '{what}'"), x._scale_inv
    if dtype_name(x.dtype).startswith("float8") and scale_inv is None:
        raise ValueError(f"generic_gemm: argument '{what}' is FP8 ({dtype_name(x.dtype)}): pass {what}_scale_inv= "
                         f"(a [1] float32 tensor) or a Float8Tensor")
    return x, scale_inv


def _window_pair(w, default, where: str):
    """TE's window_size, (left, right) with None or -1 for unbounded, as two
    ints; None gives `default`."""
    if w is None:
        return default
    try:
        left, right = w
    except (TypeError, ValueError):
        left = right = "bad"
    if not all(v is None or (isinstance(v, numbers.Integral) and not isinstance(v, bool)) for v in (left, right)):
        raise ValueError(f"{where} must be None or a pair (left, right) of ints (-1 or None: unbounded), got {w!r}")
    return tuple(-1 if v is None else int(v) for v in (left, right))


# TransformerEngine quantizers whose scale is not a given per-tensor scale:
# tefl's fused FP8 outputs quantize with quantizer.scale as it stands, which
# for these would be a stale or meaningless scale, so they are refused.
_UNFUSED_QUANTIZERS = {
    "Float8CurrentScalingQuantizer": "current scaling (compute the amax with tefl.compute_amax and the scale with "
                                     "tefl.compute_scale_from_amax, then pass a tefl.Float8Quantizer)",
    "MXFP8Quantizer": "MXFP8 block scaling", "Float8BlockQuantizer": "FP8 block scaling",
    "NVFP4Quantizer": "NVFP4"}


def _quantizer_dtype(q, op: str = "generic_gemm") -> str:
    kind = _UNFUSED_QUANTIZERS.get(type(q).__name__)
    if kind is not None:
        raise NotImplementedError(f"{op}: a {type(q).__name__} is not supported: tefl's FP8 outputs use per-tensor "
                                  f"scaling with the quantizer's given scale (TE's Float8Quantizer, delayed "
                                  f"scaling), not {kind}")
    if not (hasattr(q, "scale") and hasattr(q, "amax")):
        raise TypeError(f"{op}: a quantizer needs 'scale' and 'amax' tensors and an FP8 'dtype' "
                        f"(tefl.Float8Quantizer), got {type(q).__name__}")
    d = getattr(q, "dtype", None)
    try:
        return _FP8_NAMES[DType(int(d))]
    except (ValueError, KeyError, TypeError):
        try:
            name = dtype_name(d)
        except (ValueError, KeyError, TypeError):
            name = None
        if name not in _FP8_NAMES.values():
            raise ValueError(f"{op}: quantizer.dtype must be DType.kFloat8E4M3 or DType.kFloat8E5M2 (or the "
                             f"float8_e4m3fn / float8_e5m2 dtype), got {d!r}") from None
        return name


# The row-major call's argument names (and positions) in the caller's terms:
# its A is TE's B and its B TE's A (row-major D = op(B') op(A'), the column-
# major statement transposed), and pre_gelu_out is gelu_in.
# (A_scale_inv is also a Float8Tensor A's scale_inv.)
_TE_GEMM_NAMES = {"A": "B", "B": "A", "a_scale_inv": "B_scale_inv", "b_scale_inv": "A_scale_inv",
                  "pre_gelu_out": "gelu_in", "d_scale": "quantizer.scale", "d_amax": "quantizer.amax"}


def _te_gemm_names(message: str) -> str:
    def rename(m):
        return f"argument '{_TE_GEMM_NAMES.get(m.group(1), m.group(1))}'"

    return re.sub(r"argument '([A-Za-z_]+)' \((?:input|output) \d+\)", rename, message)


def generic_gemm(A, transA, B, transB, D=None, quantizer=None, output_dtype=None, bias=None, bias_type=None,
                 gelu=False, gelu_in=None, grad=False, workspace=None, workspace_size=0, accumulate=False,
                 use_split_accumulator=False, comm_overlap=None, comm_type=None, extra_output=None,
                 bulk_overlap=False, alpha=1.0, beta=None, *, A_scale_inv=None, B_scale_inv=None, _call=None):
    """generic_gemm: TransformerEngine's call (column-major statement, see the
    tefl._te_api docstring) -> (out, bias_grad, gelu_input, extra_output).

    out [rows of op'(B), cols of op'(A)] in row-major terms, e.g. fprop
    ``generic_gemm(W, True, x, False, ...)`` gives ``x @ W.T``. ``bias`` (not
    with grad) is added per output column; with ``grad`` and a ``bias``
    argument, ``bias_grad`` is the bias gradient (TE's wgrad: ``dy.sum(0)``).
    ``gelu`` applies tanh-GELU and returns the pre-GELU values (into
    ``gelu_in`` when given). ``gelu`` with ``grad`` is TE's DGELU epilogue:
    ``gelu_in`` (required) holds the forward's pre-GELU values, out =
    ``(op'(A) op'(B)) * gelu'(gelu_in)`` and, with a ``bias`` argument,
    ``bias_grad`` = the column sums of out. ``accumulate`` adds into ``D``. ``workspace``,
    ``workspace_size``, ``bias_type`` and ``use_split_accumulator`` are cuBLAS
    details, accepted and unused on tefl's CPU implementations. ``alpha`` and
    ``beta`` are TE's: D = alpha * product + beta * D, beta defaulting to 1
    with ``accumulate`` and 0 without (a nonzero beta without ``accumulate``
    is an error, as in TE). ``comm_overlap`` (Userbuffers communication
    overlap) must be None: tefl has no communicator, so it is refused rather
    than skipped; ``comm_type`` and ``bulk_overlap`` only matter with it.
    ``extra_output`` is returned as the fourth element, as TE does.
    """
    if comm_overlap is not None:
        raise NotImplementedError(f"generic_gemm: comm_overlap (TE's Userbuffers GEMM/communication overlap) is not "
                                  f"supported by tefl; got {type(comm_overlap).__name__}: pass comm_overlap=None")
    if beta is None:
        beta = 1.0 if accumulate else 0.0
    elif not accumulate and float(beta) != 0.0:
        raise ValueError(f"generic_gemm: beta={beta!r} without accumulate=True: beta scales D's previous contents, "
                         f"which are only read with accumulate=True")
    if _call is None:
        from .core import get_default_manager

        _call = get_default_manager().function("generic_gemm")
    a, a_si = _fp8_operand(_gemm_operand(B, "B"), B_scale_inv, "B")  # row-major A' = TE's B
    b, b_si = _fp8_operand(_gemm_operand(A, "A"), A_scale_inv, "A")  # row-major B' = TE's A
    ta, tb = bool(transB), bool(transA)
    _check_gemm_operands(A, a, transA, B, b, transB)
    m = a.shape[1] if ta else a.shape[0]
    n = b.shape[0] if tb else b.shape[1]
    if accumulate and D is None:
        raise ValueError("generic_gemm: accumulate=True adds into D: pass D")
    from ._ops import _empty

    d_scale = d_amax = None
    out_name = None
    if quantizer is not None:
        out_name = _quantizer_dtype(quantizer)
        d_scale = quantizer.scale
        d_amax = _empty(quantizer.amax, tuple(quantizer.amax.shape), "float32")  # folded into quantizer.amax
    elif output_dtype is not None:
        try:
            out_name = dtype_name(output_dtype)
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"generic_gemm: argument 'output_dtype' expects a tefl.DType, a torch/numpy dtype or a "
                             f"dtype name, got {output_dtype!r}") from None
    if D is not None and quantizer is None and out_name is not None and dtype_name(D.dtype) != out_name:
        raise ValueError(f"generic_gemm: argument 'output_dtype' is {out_name} but D holds {dtype_name(D.dtype)}: "
                         f"pass a D of {out_name}, or output_dtype=None to take D's dtype")
    if D is None:
        default = dtype_name(a.dtype)
        if default.startswith("float8"):
            default = "float32"
        D = _empty(a, (m, n), out_name or default)
    fdt = dtype_name(D.dtype)
    fdt = "float32" if fdt.startswith("float8") else fdt
    pre = None
    if gelu:
        if grad and gelu_in is None:
            raise ValueError("generic_gemm: gelu=True with grad=True (TE's DGELU epilogue) reads the forward's "
                             "pre-GELU values: pass gelu_in")
        pre = gelu_in if gelu_in is not None else _empty(a, (m, n), fdt)
    bias_grad = None
    if grad and bias is not None:  # DGELU: column sums of out [n]; else TE's wgrad dy.sum(0) [m]
        bias_grad = _empty(a, (n,) if gelu else (m,), dtype_name(bias.dtype))
    try:
        _call(a, b, bias=None if grad else bias, a_scale_inv=a_si, b_scale_inv=b_si, d_scale=d_scale, transa=ta,
              transb=tb, alpha=float(alpha), beta=float(beta), accumulate=bool(accumulate),
              gelu=bool(gelu), grad=bool(grad), use_split_accumulator=bool(use_split_accumulator),
              out=(D, pre, bias_grad, d_amax))
    except (ValueError, TypeError) as e:
        renamed = _te_gemm_names(str(e))
        if type(e) not in (ValueError, TypeError) or renamed == str(e):
            raise
        raise type(e)(renamed) from None
    out = D
    if quantizer is not None:
        _amax_into(quantizer, d_amax)
        torch = sys.modules.get("torch")
        scale_inv = 1.0 / quantizer.scale if torch is not None and isinstance(quantizer.scale, torch.Tensor) else None
        out = Float8Tensor(D, scale_inv, DType.kFloat8E4M3 if out_name == "float8_e4m3fn" else DType.kFloat8E5M2)
    return out, bias_grad, pre, extra_output


# ---- attention ---------------------------------------------------------------------------

_MASKS = {"no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3, "causal_bottom_right": 4,
          "padding_causal_bottom_right": 5}
_FORMATS = {"sbhd": 0, "bshd": 1, "thd": 2}
_SOFTMAX = {"vanilla": 0, "off-by-one": 1, "off_by_one": 1, "learnable": 2}


def _enum_value(value, table: Dict[str, int], what: str, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        key = value.lower()
        if key.startswith("nvte_"):
            key = key[5:]
        key = key.replace("_mask", "") if key.endswith("_mask") and key not in table else key
        if key not in table:
            raise ValueError(f"{where}: unknown {what} {value!r} (known: {', '.join(table)})")
        return table[key]
    return int(getattr(value, "value", value))


def _format_of(qkv_layout, where: str) -> int:
    """TE's qkv_layout ("sbh3d", "bshd_bshd_bshd", "thd_t2hd", ...) or an
    NVTE_QKV_Format value -> tefl_qkv_format (sbhd 0, bshd 1, thd 2)."""
    if qkv_layout is None:
        return 0
    if isinstance(qkv_layout, str):
        head = qkv_layout.lower()
        if head.startswith("nvte_"):
            head = head[5:]
        fmts = []
        for part in head.split("_"):
            fmt = 0 if part.startswith("sb") else 1 if part.startswith("bs") else 2 if part.startswith("t") else None
            if fmt is None:
                raise ValueError(f"{where}: unknown qkv layout {qkv_layout!r} (expected sbhd..., bshd... or thd... "
                                 f"layouts)")
            fmts.append(fmt)
        if len(set(fmts)) > 1:
            # One qkv_format per call: k and v would be read in q's format (wrong, silently, when shapes agree).
            raise ValueError(f"{where}: mixed qkv layout {qkv_layout!r} is not supported: q, k and v must share one "
                             f"format (sbhd, bshd or thd)")
        return fmts[0]
    return int(getattr(qkv_layout, "value", qkv_layout))


def _param(p, *names, default=None):
    for n in names:
        if isinstance(p, dict) and n in p:
            return p[n]
        if hasattr(p, n):
            return getattr(p, n)
    return default


# The fields a dict of attention parameters may have: TE's AttentionParams
# (TE 2.x) and tefl's own names; any other key is a misspelling, refused
# rather than silently ignored (which would answer for a different call).
_ATTENTION_PARAM_FIELDS = frozenset({
    "qkv_type", "qkv_dtype", "qkv_layout", "qkv_format", "batch_size", "num_heads", "num_gqa_groups",
    "max_seqlen_q", "max_seqlen_kv", "head_dim_qk", "head_dim_v", "attn_mask_type", "window_size",
    "alibi_slopes_shape", "core_attention_bias_type", "core_attention_bias_shape",
    "core_attention_bias_requires_grad", "pad_between_seqs", "attention_dropout", "context_parallel",
    "cp_comm_type", "deterministic", "is_training", "fp8", "fp8_meta", "inference_params", "softmax_type",
    "return_max_logit",
    # tefl's names
    "dtype", "batch", "seqlen_q", "seqlen_kv", "num_heads_q", "num_heads_kv", "mask_type", "dropout"})


def attention_backend(attention_params=None, manager=None) -> Dict[str, Any]:
    """tefl's full answer for an attention call: the implementation that
    would serve it, the fallbacks, and every candidate with its rejection
    reason. ``attention_params`` is TE's AttentionParams (or a dict with its
    field names, or tefl's: batch, seqlen_q, ...); None asks about a default
    call (fp32, bshd, 1 x 1 x 1 x 64)."""
    from .core import _policy_var, get_default_manager

    mgr = manager or get_default_manager()
    mgr.ensure_initialized()
    p = attention_params if attention_params is not None else {}
    if isinstance(p, (bool, int, float, str, bytes, list, tuple)):
        raise TypeError(f"attention_backend: attention_params must be TE's AttentionParams, a dict of its fields "
                        f"or None, got {type(p).__name__}")
    if isinstance(p, dict):
        unknown = sorted(str(k) for k in p if k not in _ATTENTION_PARAM_FIELDS)
        if unknown:
            raise TypeError(f"attention_backend: attention_params has no field(s) {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(sorted(_ATTENTION_PARAM_FIELDS))})")
    dtype = _param(p, "qkv_dtype", "dtype")
    window = _window_pair(_param(p, "window_size", default=None), (-1, -1),
                          "attention_backend: attention_params.window_size")
    params = {
        "dtype": dtype_name(dtype) if dtype is not None else "float32",
        "qkv_format": _format_of(_param(p, "qkv_format", "qkv_layout"), "attention_backend: attention_params.qkv_format"),
        "batch": int(_param(p, "batch_size", "batch", default=1)),
        "seqlen_q": int(_param(p, "max_seqlen_q", "seqlen_q", default=1)),
        "seqlen_kv": int(_param(p, "max_seqlen_kv", "seqlen_kv", default=1)),
        "num_heads_q": int(_param(p, "num_heads", "num_heads_q", default=1)),
        "num_heads_kv": int(_param(p, "num_gqa_groups", "num_heads_kv", default=0) or
                            _param(p, "num_heads", "num_heads_q", default=1)),
        "head_dim_qk": int(_param(p, "head_dim_qk", default=64)),
        "head_dim_v": int(_param(p, "head_dim_v", default=0) or _param(p, "head_dim_qk", default=64)),
        "mask_type": _enum_value(_param(p, "attn_mask_type", "mask_type"), _MASKS, "mask type",
                                 "attention_backend: attention_params.attn_mask_type"),
        "window_left": window[0],
        "window_right": window[1],
        "softmax_type": _enum_value(_param(p, "softmax_type"), _SOFTMAX, "softmax type",
                                    "attention_backend: attention_params.softmax_type"),
        "dropout": float(_param(p, "attention_dropout", "dropout", default=0.0) or 0.0),
        "is_training": bool(_param(p, "is_training", default=False)),
    }
    if params["qkv_format"] == 2 and _param(p, "max_seqlen_q") is not None:
        # thd: TE's max_seqlen_q/kv are per sequence, tefl's seqlen the total
        # tokens; without lengths, assume batch sequences of max_seqlen each.
        params["seqlen_q"] *= params["batch"]
        params["seqlen_kv"] *= params["batch"]
    core_mgr = mgr._m
    r = core_mgr.attention_backend(params, _policy_var.get())
    missing = _unsupported_attention_features(lambda n: _param(p, n), "attention_params")
    if missing:
        # Every candidate would compute something else: not available.
        why = "tefl's attention has no " + "; no ".join(missing)
        r = dict(r, available=False, impl_id=None, fallbacks=[], chain=[],
                 error=why if not r.get("error") else why + "; " + r["error"], text=why)
    return r


# TE features tefl's attention does not compute, as (field, is_set, what):
# a call or query that sets one is refused rather than run without it.
_ATTENTION_FEATURES = (
    ("core_attention_bias_type", lambda v: v not in (None, "no_bias"), "attention bias"),
    ("core_attention_bias", lambda v: v is not None, "attention bias"),
    ("alibi_slopes_shape", lambda v: v is not None, "ALiBi slopes"),
    ("alibi_slopes", lambda v: v is not None, "ALiBi slopes"),
    ("fp8", bool, "FP8 attention"),
    ("fp8_output", bool, "FP8 attention output"),
    ("pad_between_seqs", bool, "padding between thd sequences"),
    ("return_max_logit", bool, "max-logit output"),
    ("context_parallel", bool, "context parallelism"),
    ("cp_group", lambda v: v is not None, "context parallelism"),
    ("inference_params", lambda v: v is not None, "KV-cache inference"),
)


# TE's FlashAttention/DotProductAttention forward keywords besides those
# forward names: accepted, and refused by _unsupported_attention_features
# when they ask for a feature tefl lacks; the rest carry no meaning here.
_FLASH_KWARGS = frozenset({f for f, _, _ in _ATTENTION_FEATURES} | {
    "cp_global_ranks", "cp_stream", "cp_comm_type", "fp8_meta", "quantizers", "flash_attention_backend",
    "core_attention_bias_requires_grad", "checkpoint_core_attention", "fast_zero_fill", "is_first_microbatch"})


def _unsupported_attention_features(get, where: str):
    """'where.field=value (what)' for each set feature of _ATTENTION_FEATURES."""
    out = []
    for field, is_set, what in _ATTENTION_FEATURES:
        v = get(field)
        try:
            hit = v is not None and is_set(v)
        except Exception:  # e.g. a tensor's truth value: set
            hit = True
        if hit:
            out.append(f"{what} ({where}.{field}={v!r})" if not hasattr(v, "shape") else f"{what} ({where}.{field})")
    return out


def get_attention_backend(attention_params=None):
    """TE's get_attention_backend contract: (use_flash_attention,
    flash_attention_backend, use_fused_attention, fused_attention_backend,
    use_unfused_attention, available_backends). tefl's attention is one
    flash-style op, so a served call reports flash attention with the serving
    implementation id as its backend; otherwise TE's unfused path is chosen.
    ``tefl.attention_backend(params)`` has the reasons."""
    r = attention_backend(attention_params)
    if r["available"]:
        return True, r["impl_id"], False, None, False, [True, False, False]
    return False, None, False, None, True, [False, False, True]


class FlashAttention:
    """TE's flash-attention module contract on ``fused_attn_fwd``/``_bwd``.

    ``FlashAttention(softmax_scale, attention_type="self", layer_number=None,
    deterministic=False, attention_dropout=0.0, attention_dropout_ctx=None)``;
    calling it with ``(query_layer, key_layer, value_layer, attention_mask=None,
    qkv_layout="sbh3d", cu_seqlens_q=None, cu_seqlens_kv=None,
    max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type="causal",
    window_size=None, ...)`` returns the attention output with the heads
    merged (``[s, b, h*d]``, ``[b, s, h*d]`` or ``[t, h*d]``). With torch
    tensors that require grad, the result is differentiable (the backward
    runs ``fused_attn_bwd`` from the saved statistics)."""

    def __init__(self, softmax_scale, attention_type: str = "self", layer_number=None, deterministic: bool = False,
                 attention_dropout: float = 0.0, attention_dropout_ctx=None, **kwargs):
        if softmax_scale is None:
            self.softmax_scale = 0.0  # fused_attn_fwd's default, 1/sqrt(d)
        else:
            try:
                self.softmax_scale = float(softmax_scale)
            except (TypeError, ValueError):
                raise TypeError(f"FlashAttention: softmax_scale expects a number (or None for 1/sqrt(d)), "
                                f"got {softmax_scale!r}") from None
            if not math.isfinite(self.softmax_scale) or self.softmax_scale == 0.0:
                # fused_attn_fwd reads a scale of 0 as "the default": a requested 0 would silently become 1/sqrt(d).
                raise ValueError(f"FlashAttention: softmax_scale must be finite and nonzero (None for 1/sqrt(d)), "
                                 f"got {softmax_scale!r}")
        self.attention_type = attention_type
        self.layer_number = layer_number
        self.deterministic = deterministic
        self.attention_dropout = float(attention_dropout)
        self.attention_dropout_ctx = attention_dropout_ctx
        self.training = True

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def __call__(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_layout="sbh3d",
                 cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                 attn_mask_type="causal", window_size=None, softmax_offset=None, **kwargs):
        return self.forward(query_layer, key_layer, value_layer, attention_mask, qkv_layout, cu_seqlens_q,
                            cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, attn_mask_type, window_size,
                            softmax_offset, **kwargs)

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_layout="sbh3d",
                cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None,
                attn_mask_type="causal", window_size=None, softmax_offset=None, softmax_type="vanilla", **kwargs):
        unknown = sorted(set(kwargs) - _FLASH_KWARGS)
        if unknown:
            raise TypeError(f"FlashAttention.forward: unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
                            f"(known besides the named ones: {', '.join(sorted(_FLASH_KWARGS))})")
        missing = _unsupported_attention_features(kwargs.get, "FlashAttention.forward")
        if missing:
            raise NotImplementedError("tefl's attention has no " + "; no ".join(missing))
        fmt = _format_of(qkv_layout, "FlashAttention: qkv_layout")
        mask = _enum_value(attn_mask_type, _MASKS, "mask type", "FlashAttention: attn_mask_type")
        wl, wr = _window_pair(window_size, (-1, 0 if mask in (2, 3, 4, 5) else -1), "FlashAttention: window_size")
        attrs = dict(qkv_format=fmt, mask_type=mask, window_left=wl, window_right=wr,
                     softmax_type=_enum_value(softmax_type, _SOFTMAX, "softmax type", "FlashAttention: softmax_type"),
                     scale=self.softmax_scale,
                     dropout=self.attention_dropout if self.training else 0.0, is_training=bool(self.training))
        if attention_mask is not None:
            cu_seqlens_q, cu_seqlens_kv = _cu_seqlens_of_mask(attention_mask, query_layer, key_layer, fmt, mask,
                                                              cu_seqlens_q, cu_seqlens_kv)
        if attrs["dropout"] > 0:
            torch = sys.modules.get("torch")
            attrs["seed"] = int(torch.empty((), dtype=torch.int64).random_().item()) if torch else 0
            attrs["offset"] = 0
        o = _attention(query_layer, key_layer, value_layer, cu_seqlens_q, cu_seqlens_kv, softmax_offset, attrs)
        return o.reshape(*o.shape[:-2], o.shape[-2] * o.shape[-1])


def _lengths_of_padding_mask(m, b, s, what):
    """Per-sequence lengths [b] (int64) of TE's padding mask ([b, 1, 1, s]
    bool, True = padding), which must pad after the valid tokens."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(m, torch.Tensor):
        raise TypeError(f"FlashAttention: {what} expects a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool:
        raise TypeError(f"FlashAttention: {what} expects a bool mask (True = padding), got {m.dtype}")
    if m.dim() != 4 or tuple(m.shape) != (b, 1, 1, s):
        raise ValueError(f"FlashAttention: {what} expects shape [{b}, 1, 1, {s}] ([batch, 1, 1, seqlen]), "
                         f"got {list(m.shape)}")
    valid = ~m.reshape(b, s).cpu()
    lengths = valid.sum(dim=1)
    right_padded = torch.arange(s).unsqueeze(0) < lengths.unsqueeze(1)
    if not torch.equal(valid, right_padded):
        rows = [int(r) for r in (valid != right_padded).any(dim=1).nonzero().flatten()[:4]]
        raise ValueError(f"FlashAttention: {what} has padding before valid tokens (batch rows {rows}); tefl's "
                         f"attention takes a padding mask as sequence lengths (valid tokens first): pad at the "
                         f"end, or pass the sequences packed with cu_seqlens_q/_kv in thd format")
    return lengths


def _cu_seqlens_of_mask(attention_mask, q, k, fmt, mask, cu_q, cu_kv):
    """cu_seqlens_q/_kv from TE's padding mask (a [b, 1, 1, s] bool tensor,
    or a pair (q's, kv's)), as TE's FlashAttention derives them; given
    cu_seqlens must agree. Only a padding mask type in sbhd/bshd reads it."""
    if mask not in (1, 3, 5) or fmt == 2:
        names = {v: n for n, v in _MASKS.items()}
        raise ValueError(f"FlashAttention: attention_mask is read only with a padding mask type in sbhd or bshd "
                         f"(it gives the sequence lengths), got attn_mask_type '{names.get(mask, mask)}' in "
                         f"{'thd' if fmt == 2 else 'sbhd' if fmt == 0 else 'bshd'}: pass attention_mask=None")
    torch = sys.modules["torch"]
    b, sq, skv = (q.shape[1], q.shape[0], k.shape[0]) if fmt == 0 else (q.shape[0], q.shape[1], k.shape[1])
    if isinstance(attention_mask, (tuple, list)):
        if len(attention_mask) != 2:
            raise ValueError(f"FlashAttention: attention_mask expects a mask or a pair (q's, kv's), got "
                             f"{len(attention_mask)} entries")
        m_q, m_kv, names = attention_mask[0], attention_mask[1], ("attention_mask[0]", "attention_mask[1]")
    else:
        if sq != skv:
            raise ValueError(f"FlashAttention: one attention_mask for queries ({sq}) and keys ({skv}) of different "
                             f"lengths: pass a pair (q's mask, kv's mask)")
        m_q = m_kv = attention_mask
        names = ("attention_mask", "attention_mask")
    out = []
    for m, s, name, given, given_name in ((m_q, sq, names[0], cu_q, "cu_seqlens_q"),
                                          (m_kv, skv, names[1], cu_kv, "cu_seqlens_kv")):
        lengths = _lengths_of_padding_mask(m, b, s, name)
        cu = torch.zeros(b + 1, dtype=torch.int32)
        cu[1:] = lengths.cumsum(0)
        if given is not None and not torch.equal(torch.as_tensor(given).cpu().to(torch.int32), cu):
            raise ValueError(f"FlashAttention: {given_name} {torch.as_tensor(given).tolist()} disagrees with "
                             f"{name} (lengths {lengths.tolist()}): pass one of them")
        out.append(cu if given is None else given)
    return out[0], out[1]


def _attention(q, k, v, cu_q, cu_kv, alpha, attrs):
    from .core import get_default_manager

    mgr = get_default_manager()
    torch = sys.modules.get("torch")
    needs_grad = torch is not None and torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, alpha))
    if not needs_grad:
        if torch is not None and isinstance(q, torch.Tensor):
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, _ = mgr.call("fused_attn_fwd", q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, softmax_offset=alpha,
                        **attrs)
        return o
    return _attention_function()(q, k, v, cu_q, cu_kv, alpha, attrs)


_FUNCTION = None


def _attention_function():
    """A torch.autograd.Function over fused_attn_fwd/bwd (built on first use)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION.apply
    import torch

    from .core import get_default_manager

    class TeflAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_kv, alpha, attrs):
            q, k, v = (t.detach().contiguous() for t in (q, k, v))
            a = alpha.detach().contiguous() if alpha is not None else None
            o, stats = get_default_manager().call("fused_attn_fwd", q, k, v, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                                  softmax_offset=a, **attrs)
            ctx.save_for_backward(q, k, v, o, stats)
            ctx.extra = (cu_q, cu_kv, a, attrs)
            return o

        @staticmethod
        def backward(ctx, d_o):
            q, k, v, o, stats = ctx.saved_tensors
            cu_q, cu_kv, a, attrs = ctx.extra
            dq, dk, dv, dalpha = get_default_manager().call(
                "fused_attn_bwd", q, k, v, o, d_o.contiguous(), stats, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                softmax_offset=a, **attrs)
            return dq, dk, dv, None, None, dalpha if a is not None else None, None

    _FUNCTION = TeflAttention
    return _FUNCTION.apply


def flash_attention(*args, **kwargs) -> FlashAttention:
    """TE reads ``tex.flash_attention`` as a class or a factory of the
    attention module: this builds a FlashAttention."""
    return FlashAttention(*args, **kwargs)


def get_flash_attention_class():
    return FlashAttention
