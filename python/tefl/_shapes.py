"""Output shapes and dtypes, inferred from the op schemas' shape docs.

The schemas describe each argument's shape as text ("[N..., H]", "like x",
"[N] or x.shape[:-1]", "[b, h, sq, sk]"). This module turns an output's doc
into Python expressions over the call's inputs, with a few rules:

1. a family rule for the op, if one is registered below (ops whose output
   shape depends on attributes, e.g. the qkv RoPE split);
2. "like NAME": the shape of input NAME (and its dtype unless the output has
   a single allowed dtype);
3. an input with exactly the same doc: shape and dtype of that input (dgamma
   "[H]" is shaped and typed like gamma "[H]");
4. symbolic: the dims of the output's first "[...]" group are bound from the
   inputs' docs ("N..." = leading dims, "H" = a dim, "2H" = twice one; "[N]"
   after "[N..., H]" is the product of the leading dims).

The dtype is the output's only allowed dtype if it has one, else "dtype of
NAME" if the doc says so, else that of the input the shape came from.
An output no rule covers must be passed by the caller (out=...); the error
says so. New ops need nothing here when their docs follow these forms.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Tuple

# (shape expression, dtype expression, reference-tensor expression); the
# expressions use the variables _i<j> (inputs) and _a<k> (attributes).
Rule = Tuple[str, str, str]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class NotInferable(Exception):
    pass


def _bracket(doc: str) -> Optional[List[str]]:
    """Tokens of the first [...] group of a doc, or None."""
    doc = doc.strip()
    if not doc.startswith("["):
        return None
    end = doc.find("]")
    if end < 0:
        return None
    body = doc[1:end].strip()
    if not body:
        return []
    return [t.strip() for t in body.split(",")]


def _like_target(doc: str) -> Optional[str]:
    m = re.match(r"^\s*like\s+([A-Za-z_][A-Za-z0-9_]*)", doc)
    return m.group(1) if m else None


def _dtype_of_target(doc: str) -> Optional[str]:
    m = re.search(r"dtype of\s+([A-Za-z_][A-Za-z0-9_]*)", doc)
    return m.group(1) if m else None


def _bindings(schema) -> Dict[str, Tuple[str, int]]:
    """Symbol -> (expression, input index) from the inputs' docs."""
    out: Dict[str, Tuple[str, int]] = {}
    for j, arg in enumerate(schema["inputs"]):
        if arg["optional"]:
            continue
        toks = _bracket(arg["shape"])
        if toks is None:
            continue
        var = f"_i{j}"
        variadic = bool(toks) and toks[0].endswith("...")
        n = len(toks)
        for pos, tok in enumerate(toks):
            if variadic and pos == 0:
                sym = tok[:-3].strip()
                tail = n - 1
                if sym and sym + "..." not in out:
                    out[sym + "..."] = (f"{var}.shape[:{var}.ndim - {tail}]" if tail else f"{var}.shape", j)
                    out.setdefault(sym, (f"_prod({var}.shape[:{var}.ndim - {tail}])" if tail
                                         else f"_prod({var}.shape)", j))
                continue
            idx = f"{var}.shape[{pos - n}]" if variadic else f"{var}.shape[{pos}]"
            m = re.match(r"^(\d+)\s*\*?\s*([A-Za-z_][A-Za-z0-9_]*)$", tok)
            if m:  # "2H": H = dim // 2
                out.setdefault(m.group(2), (f"({idx} // {int(m.group(1))})", j))
            elif _IDENT.match(tok):
                out.setdefault(tok, (idx, j))
    return out


def _single_dtype(arg) -> Optional[str]:
    return arg["dtypes"][0] if len(arg["dtypes"]) == 1 else None


def generic_rule(schema, k: int) -> Rule:
    out = schema["outputs"][k]
    doc = out["shape"]
    names = [a["name"] for a in schema["inputs"]]
    fixed = _single_dtype(out)
    dtype_src = _dtype_of_target(doc)

    def dtype_for(j: int) -> str:
        if fixed:
            return repr(fixed)
        if dtype_src in names:
            return f"_i{names.index(dtype_src)}.dtype"
        if not set(out["dtypes"]) & set(schema["inputs"][j]["dtypes"]):
            # e.g. quantize's q (FP8) like x (float): the output's first dtype
            # (E4M3; float32 for dequantize); out= chooses another.
            return repr(out["dtypes"][0])
        return f"_i{j}.dtype"

    target = _like_target(doc)
    if target in names:
        j = names.index(target)
        return f"_i{j}.shape", dtype_for(j), f"_i{j}"
    for j, arg in enumerate(schema["inputs"]):
        if arg["shape"].strip() == doc.strip() and not arg["optional"]:
            return f"_i{j}.shape", dtype_for(j), f"_i{j}"
    toks = _bracket(doc.split(" or ")[0])
    if toks is None:
        raise NotInferable(doc)
    binds = _bindings(schema)
    parts: List[str] = []
    src: Optional[int] = None
    for tok in toks:
        if tok.endswith("..."):
            key = tok[:-3].strip() + "..."
            if key not in binds:
                raise NotInferable(doc)
            expr, j = binds[key]
            parts.append(f"*{expr}")
        else:
            m = re.match(r"^(\d+)\s*\*?\s*([A-Za-z_][A-Za-z0-9_]*)$", tok)
            if m and m.group(2) in binds:
                expr, j = binds[m.group(2)]
                parts.append(f"{int(m.group(1))} * {expr}")
            elif tok in binds:
                expr, j = binds[tok]
                parts.append(expr)
            elif tok.isdigit():
                parts.append(tok)
                continue
            else:
                raise NotInferable(doc)
        src = j if src is None else src
    if src is None:
        src = 0
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")", dtype_for(src), f"_i{src}"


# ---- family rules -------------------------------------------------------------
# fused_qkv_rope_forward: qkv [s, b, h, q+k+v] (bshd [b, s, ...]) -> q, k, v
# [s, b, h * split / d, d] with d the head dim = k_split, as TransformerEngine
# allocates them (qkv_split_arg_list[1]; TE has d = k_split = v_split). The
# rotary dim (the last dim of q_freqs) may be smaller: the rest of each head
# is copied. The splits are checked before anything is allocated
# (_qkv_out_shape in _ops.py).
def _qkv_rope_forward(schema, k: int) -> Rule:
    names = [a["name"] for a in schema["inputs"]]
    attrs = [a["name"] for a in schema["attrs"]]
    qkv = f"_i{names.index('qkv')}"
    qs, ks, vs = (f"_a{attrs.index(n)}" for n in ("q_split", "k_split", "v_split"))
    return f"_qkv_out_shape({qkv}, {qs}, {ks}, {vs}, {k})", f"{qkv}.dtype", qkv


def _qkv_rope_backward(schema, k: int) -> Rule:
    names = [a["name"] for a in schema["inputs"]]
    attrs = [a["name"] for a in schema["attrs"]]
    q = f"_i{names.index('q_grads')}"
    qs, ks, vs = (f"_a{attrs.index(n)}" for n in ("q_split", "k_split", "v_split"))
    h = f"{q}.shape[2] * {q}.shape[3] // {qs}"
    return f"({q}.shape[0], {q}.shape[1], {h}, {qs} + {ks} + {vs})", f"{q}.dtype", q


def _index(schema, kind: str, name: str) -> str:
    names = [a["name"] for a in schema[kind]]
    return f"_{'i' if kind == 'inputs' else 'a'}{names.index(name)}"


# generic_gemm (row-major, docs/ops-gemm.md): D [M, N] with M from op(A) and N
# from op(B); pre_gelu_out when gelu (not with grad: DGELU reads it, so the
# caller passes it), bias_grad [M] when grad ([N] with gelu too: column sums
# of D); d_amax only when passed.
def _generic_gemm(schema, k: int):
    a, b = _index(schema, "inputs", "A"), _index(schema, "inputs", "B")
    ta, tb = _index(schema, "attrs", "transa"), _index(schema, "attrs", "transb")
    m = f"({a}.shape[1] if {ta} else {a}.shape[0])"
    n = f"({b}.shape[0] if {tb} else {b}.shape[1])"
    name = schema["outputs"][k]["name"]
    if name == "D":
        return f"({m}, {n})", f"{a}.dtype", a
    gelu, grad = _index(schema, "attrs", "gelu"), _index(schema, "attrs", "grad")
    if name == "pre_gelu_out":
        return f"({m}, {n})", f"_gemm_float({a}.dtype)", a, f"({gelu} and not {grad})"
    if name == "bias_grad":
        return f"(({n} if {gelu} else {m}),)", f"_gemm_float({a}.dtype)", a, grad
    raise NotInferable(name)


# te_general_grouped_gemm: D [sum(m_splits), N] with N from B [G, K, N] ([G, N, K] with transb);
# with transa D [G, M, N] (A [S, M], B [S, N], G = len(m_splits)). pre_gelu_out like D when gelu (not
# with grad), bias_grad when grad: [G, N] with gelu, [G, M] with transa, else [S]; d_amax when passed.
def _grouped_gemm(schema, k: int) -> Rule:
    a, b = _index(schema, "inputs", "A"), _index(schema, "inputs", "B")
    sp = _index(schema, "inputs", "m_splits")
    ta, tb = _index(schema, "attrs", "transa"), _index(schema, "attrs", "transb")
    gelu, grad = _index(schema, "attrs", "gelu"), _index(schema, "attrs", "grad")
    n = f"({b}.shape[1] if ({ta} or {tb}) else {b}.shape[2])"
    d = f"(({sp}.shape[0], {a}.shape[1], {n}) if {ta} else ({a}.shape[0], {n}))"
    name = schema["outputs"][k]["name"]
    if name == "D":
        return d, f"_gemm_float({a}.dtype)", a
    if name == "pre_gelu_out":
        return d, f"_gemm_float({a}.dtype)", a, f"({gelu} and not {grad})"
    if name == "bias_grad":
        return (f"(({sp}.shape[0], {n}) if {gelu} else ({sp}.shape[0], {a}.shape[1]) if {ta} else ({a}.shape[0],))",
                f"_gemm_float({a}.dtype)", a, grad)
    raise NotInferable(name)


# fused_attn_fwd: o like q with v's head dim; stats [b, h_q, sq] (thd: [h_q, t_q]).
def _attn_fwd(schema, k: int) -> Rule:
    q, v = _index(schema, "inputs", "q"), _index(schema, "inputs", "v")
    fmt = _index(schema, "attrs", "qkv_format")
    if schema["outputs"][k]["name"] == "o":
        return f"(*{q}.shape[:-1], {v}.shape[-1])", f"{q}.dtype", q
    return (f"(({q}.shape[1], {q}.shape[2], {q}.shape[0]) if {fmt} == 0 else "
            f"({q}.shape[0], {q}.shape[2], {q}.shape[1]) if {fmt} == 1 else ({q}.shape[1], {q}.shape[0]))",
            "'float32'", q)


# fused_attn_bwd: dq, dk, dv like q, k, v; d_softmax_offset [h_q] when softmax_offset is given.
def _attn_bwd(schema, k: int):
    name = schema["outputs"][k]["name"]
    if name == "d_softmax_offset":
        alpha = _index(schema, "inputs", "softmax_offset")
        return f"{alpha}.shape", "'float32'", alpha, f"{alpha} is not None"
    src = _index(schema, "inputs", name[1:])
    return f"{src}.shape", f"{src}.dtype", src


FAMILY_RULES: Dict[str, Callable[[dict, int], Rule]] = {
    "fused_qkv_rope_forward": _qkv_rope_forward,
    "fused_qkv_rope_backward": _qkv_rope_backward,
    "generic_gemm": _generic_gemm,
    "te_general_grouped_gemm": _grouped_gemm,
    "fused_attn_fwd": _attn_fwd,
    "fused_attn_bwd": _attn_bwd,
}


def output_rule(schema, k: int) -> Optional[Rule]:
    """The allocation rule of output k, or None when it must be passed."""
    try:
        fam = FAMILY_RULES.get(schema["name"])
        if fam is not None:
            return fam(schema, k)
        return generic_rule(schema, k)
    except (NotInferable, ValueError):
        return None
