"""Op call signatures, generated from the C++ op schemas.

Every catalogue op gets a Python function with TransformerEngine's call
signature where one is known (the TE_SIGNATURES table, keyed by op name or
family), else the generic one: the schema's inputs, then its attributes with
their defaults, then ``out=`` (a tuple of output tensors, or one tensor for a
single output). Outputs not passed are allocated like the inputs (torch in,
torch out; numpy in, numpy out) from the shape rules of _shapes.py and the
function returns them (TE's return layout, e.g. ``(y, None, rsigma)``).

The source of each function is generated once per op and compiled; binding
arguments is CPython's own work, so the call costs no more than a
hand-written wrapper.
"""
from __future__ import annotations

import math
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _core
from ._shapes import output_rule
from ._types import DTYPE_NAMES, NAME_TO_DTYPE, DType, dtype_name

# ---- schemas ---------------------------------------------------------------------

SCHEMAS: List[dict] = _core.ops_info()
BY_NAME: Dict[str, dict] = {}
BY_ID: Dict[int, dict] = {}
for _s in SCHEMAS:
    BY_NAME[_s["name"]] = _s
    BY_ID[_s["id"]] = _s
    for _alias in _s["aliases"]:
        BY_NAME[_alias] = _s


def schema_of(op: str) -> dict:
    try:
        return BY_NAME[op]
    except KeyError:
        raise KeyError(f"unknown op '{op}' (known: {', '.join(sorted(s['name'] for s in SCHEMAS))})") from None


# ---- parameters ------------------------------------------------------------------
# A parameter is (python name, role, schema name or names). Roles:
#   in        a schema input            attr     a schema attribute
#   out       a caller-provided output  outs     generic out= (tuple or tensor)
#   quantizer TE's quantizer (None, or a Float8Quantizer where the op has an _fp8 variant)
#   otype     TE's output dtype (a DType, torch or numpy dtype) of one output
#   split3    TE's qkv_split_arg_list -> three attributes
#   rng       a dropout seed/offset attribute: None = the next value of
#             tefl's dropout generator (see dropout_rng)
_NONE = object()


def IN(py, arg=None):
    return (py, "in", arg or py)


def AT(py, attr=None):
    return (py, "attr", attr or py)


def OUT(py, out):
    return (py, "out", out)


def QUANT(py="quantizer"):
    return (py, "quantizer", None)


def OTYPE(py, out):
    return (py, "otype", out)


def SPLIT3(py, attrs):
    return (py, "split3", attrs)


def RNG(py, attr=None):
    return (py, "rng", attr or py)


def _norm_fwd(layer: bool):
    p = [IN("input", "x"), IN("weight", "gamma")] + ([IN("bias", "beta")] if layer else [])
    p += [AT("eps"), OUT("ln_out", "z"), QUANT(), OTYPE("otype", "z"), AT("sm_margin"), AT("zero_centered_gamma")]
    return p, (["z", "mu", "rsigma"] if layer else ["z", None, "rsigma"])


def _rope(first: str):
    return [IN(first), IN("freqs"), IN("start_positions"), AT("qkv_format"), AT("interleaved"), IN("cu_seqlens"),
            AT("cp_size"), AT("cp_rank")], None


def _te_for(schema) -> Optional[Tuple[list, Optional[list]]]:
    """TransformerEngine's signature of an op (params, return layout), or None."""
    name, family = schema["name"], schema["family"]
    ins = [a["name"] for a in schema["inputs"]]
    attrs = [a["name"] for a in schema["attrs"]]
    outs = [a["name"] for a in schema["outputs"]]
    if name == "layernorm_fwd":
        return _norm_fwd(True)
    if name == "rmsnorm_fwd":
        return _norm_fwd(False)
    if name in ("layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"):
        return [IN(n) for n in ins] + [AT("sm_margin"), AT("zero_centered_gamma")], None
    if name in ("fused_rope_forward", "fused_rope_backward"):
        return _rope(ins[0])
    if name == "fused_qkv_rope_forward":
        return [IN("qkv_input", "qkv"), IN("q_freqs"), IN("k_freqs"), IN("start_positions"),
                SPLIT3("qkv_split_arg_list", ("q_split", "k_split", "v_split")), AT("qkv_format"),
                AT("interleaved"), AT("cp_size"), AT("cp_rank")], None
    if name == "fused_qkv_rope_backward":
        return [IN("q_grads"), IN("k_grads"), IN("v_grads"), IN("q_freqs"), IN("k_freqs"),
                SPLIT3("qkv_split_arg_list", ("q_split", "k_split", "v_split")), AT("qkv_format"),
                AT("interleaved"), AT("cp_size"), AT("cp_rank"), IN("start_positions")], None
    if name == "dropout_fwd":
        return [IN("input"), AT("dropout_probability", "p"), OUT("out", "output"), RNG("seed"), RNG("offset")], None
    if name == "dropout_bwd":
        return [IN("grad_output"), IN("mask"), AT("dropout_probability", "p"), OUT("grad_input", "grad_input")], None
    if family == "activation":
        # gelu(input, quantizer), dgelu(grad, fwd_input, quantizer),
        # clamped_swiglu(input, quantizer, limit=7.0, alpha=1.702),
        # dbias_dgelu(grad, fwd_input, quantizer) -> (dbias, dinput)
        ret = None
        if name.startswith("dbias_") and set(outs) == {"dbias", "dinput"}:
            ret = ["dbias", "dinput"]
        return [IN(n) for n in ins] + [QUANT()] + [AT(a) for a in attrs], ret
    if family == "softmax":
        # scaled_softmax_forward(input, scale); the others take scale_factor.
        scale_name = "scale" if name == "scaled_softmax_forward" else "scale_factor"
        # the backward's first argument is TE-FL's output_grad (the schema's output_grads)
        return ([IN("output_grad", n) if n == "output_grads" else IN(n) for n in ins] +
                [AT(scale_name if a == "scale" else a, a) for a in attrs]), None
    return None


class OpSignature:
    """The Python call signature of one op and its generated function source."""

    def __init__(self, schema: dict):
        self.schema = schema
        self.name = schema["name"]
        self.op_id = schema["id"]
        ins = [a["name"] for a in schema["inputs"]]
        attrs = [a["name"] for a in schema["attrs"]]
        outs = [a["name"] for a in schema["outputs"]]
        te = _te_for(schema)
        params, returns = te if te is not None else ([], None)
        if not self._valid(params, ins, attrs, outs):
            params, returns = [], None  # schema names changed: generic signature
        # Complete with what the TE signature does not mention (generic: all).
        used = {("in", p[2]) for p in params if p[1] == "in"}
        used |= {("attr", p[2]) for p in params if p[1] in ("attr", "rng")}
        used |= {("attr", a) for p in params if p[1] == "split3" for a in p[2]}
        names = {p[0] for p in params}
        for n in ins:
            if ("in", n) not in used:
                params.append(IN(n if n not in names else f"in_{n}", n))
        for n in attrs:
            if ("attr", n) not in used:
                params.append(AT(n if n not in names else f"attr_{n}", n))
        if not any(p[1] in ("out", "outs") for p in params) or len(outs) > 1:
            if "out" not in {p[0] for p in params}:
                params.append(("out", "outs", None))
        self.params = params
        self.returns = [outs.index(r) if r is not None else None for r in (returns or outs)]
        self.ins, self.attrs, self.outs = ins, attrs, outs
        # Leading required inputs are positional (a Python implementation gets
        # them positionally, everything else by keyword).
        self.positional_ins = 0
        for py, role, tgt in params:
            if role != "in" or schema["inputs"][ins.index(tgt)]["optional"]:
                break
            self.positional_ins += 1

    @staticmethod
    def _valid(params, ins, attrs, outs) -> bool:
        for py, role, tgt in params:
            if role == "in" and tgt not in ins:
                return False
            if role in ("attr", "rng") and tgt not in attrs:
                return False
            if role in ("out", "otype") and tgt not in outs:
                return False
            if role == "split3" and not all(a in attrs for a in tgt):
                return False
        return True

    # ---- the generated function --------------------------------------------
    def source(self, mode: str) -> str:
        """Source of a factory returning the op function.

        mode "manager": __call(__id, inputs, outputs, attrs, __pget())
        mode "impl":    __call(__ref, __id, inputs, outputs, attrs)
        """
        s = self.schema
        sig: List[str] = []
        body: List[str] = []
        required_done = False
        for py, role, tgt in self.params:
            if role == "in":
                opt = s["inputs"][self.ins.index(tgt)]["optional"]
                if opt or required_done:
                    sig.append(f"{py}=None")
                    required_done = True
                else:
                    sig.append(py)
            elif role == "attr":
                a = s["attrs"][self.attrs.index(tgt)]
                sig.append(f"{py}={a['default']!r}")
                required_done = True
            else:
                sig.append(f"{py}=None")
                required_done = True
        var_in = {}
        for py, role, tgt in self.params:
            if role == "in":
                var_in[tgt] = py
        for j, n in enumerate(self.ins):
            body.append(f"_i{j} = {var_in[n]}")
        for py, role, tgt in self.params:
            if role == "quantizer":
                if mode == "impl" or not _has_fp8_variant(self.name):
                    body.append(f"if {py} is not None: _no_quantizer({self.name!r}, {py!r}, {mode!r})")
        attr_expr = {}
        for py, role, tgt in self.params:
            if role == "attr":
                attr_expr[tgt] = py
                # TE's functions raise TypeError for None here; a silent default
                # (scale 1.0 for scaled_softmax_forward(x, None)) would hide a bug.
                a = s["attrs"][self.attrs.index(tgt)]
                body.append(f"if {py} is None: _attr_none({self.name!r}, {py!r}, {a['type']!r}, {a['default']!r})")
            elif role == "split3":
                k0, k1, k2 = (self.attrs.index(a) for a in tgt)
                body.append(f"_a{k0}, _a{k1}, _a{k2} = _split3({self.name!r}, {py!r}, {py})")
                for a in tgt:
                    attr_expr[a] = None
        rng = [(py, tgt) for py, role, tgt in self.params if role == "rng"]
        for k, n in enumerate(self.attrs):
            e = attr_expr.get(n, "")
            if e:
                body.append(f"_a{k} = {e}")
        if rng:
            names = [py for py, _ in rng]
            cond = " or ".join(f"{p} is None" for p in names)
            body.append(f"if {cond}: {', '.join(names)} = _dropout_rng(_i0, {', '.join(names)})")
            for py, tgt in rng:
                body.append(f"_a{self.attrs.index(tgt)} = {py}")
        out_param = {tgt: py for py, role, tgt in self.params if role == "out"}
        otype = {tgt: py for py, role, tgt in self.params if role == "otype"}
        has_outs = any(role == "outs" for _, role, _ in self.params)
        nout = len(self.outs)
        alloc_lines: List[str] = []
        quant = [py for py, role, _ in self.params if role == "quantizer"]
        fused_q = mode == "manager" and quant and _has_fp8_variant(self.name)
        main_out = (self.returns[0] if self.returns else 0) if fused_q else None
        main_name = None
        if fused_q:
            alloc_lines.append("__qgiven = None")  # set below from the caller's main output, if any
        for k, n in enumerate(self.outs):
            given = out_param.get(n)
            if given is None and has_outs:
                given = f"_pick(out, {k}, {nout}, {self.name!r})"
            elif given is not None and has_outs:  # e.g. ln_out= and out=(y, ...): one of them, or the same tensor
                given = f"_pick_one({self.name!r}, {given!r}, {given}, _pick(out, {k}, {nout}, {self.name!r}), {k})"
            rule = output_rule(s, k)
            optional = s["outputs"][k]["optional"]
            cond = None
            if rule is not None and len(rule) == 4:
                cond = rule[3]
                rule = rule[:3]
            # The caller's tensor is checked before anything is allocated
            # (tefl's own outputs never require grad, and cost nothing here).
            grad_out = (f"getattr(_o{k}, 'requires_grad', False): "
                        f"_grad_out({self.name!r}, {out_param.get(n) or 'out'!r}, {n!r})")
            grad_check = f"if _o{k} is not None and {grad_out}"
            if optional and (rule is None or cond is None):
                # An optional output is produced only when asked for (out=),
                # or when its rule's condition holds (e.g. pre_gelu_out with gelu).
                alloc_lines.append(f"_o{k} = {given if given is not None else 'None'}")
                if given is not None:
                    alloc_lines.append(grad_check)
                continue
            if rule is None:
                alloc = f"_need_out({self.name!r}, {n!r})"
            else:
                shape, dtype, ref = rule
                like = shape == f"{ref}.shape" and dtype == f"{ref}.dtype"
                # otype: one of the output's dtypes, checked here so that the
                # error names otype (the output itself was never passed); with
                # a quantizer it is the FP8 tensor's nominal dtype, as in TE
                allowed = repr(tuple(s["outputs"][k]["dtypes"]))
                if quant:
                    allowed = f"({allowed} if {quant[0]} is None else None)"
                ot = (f"_otype({otype[n]}, {dtype}, {self.name!r}, {otype[n]!r}, {allowed}, "
                      f"{bool(quant)!r})") if n in otype else None
                if n in otype and like:
                    alloc = f"(_like({ref}) if {otype[n]} is None else _empty({ref}, {shape}, {ot}))"
                elif n in otype:
                    alloc = f"_empty({ref}, {shape}, {ot})"
                elif like:
                    alloc = f"_like({ref})"  # torch.empty_like is 2x cheaper than torch.empty
                else:
                    alloc = f"_empty({ref}, {shape}, {dtype})"
            if k == main_out:  # with a quantizer: the caller's own output, if any (see _quantized)
                main_name = out_param.get(n) or ("out" if has_outs else None)
                alloc_lines.append(f"__qgiven = {given if given is not None else 'None'}")
            if cond is not None:
                alloc_lines.append(f"_o{k} = {given if given is not None else 'None'}")
                if given is not None:
                    alloc_lines.append(grad_check)
                alloc_lines.append(f"if _o{k} is None and ({cond}): _o{k} = {alloc}")
            elif given is None:
                alloc_lines.append(f"_o{k} = {alloc}")
            elif k == main_out:  # a Float8Tensor given: _quantized writes it; allocate the plain output only if asked
                alloc_lines.append(f"_o{k} = __qgiven")
                alloc_lines.append(grad_check)
                alloc_lines.append(f"if _o{k} is None or {quant[0]} is not None: _o{k} = {alloc}")
            else:
                alloc_lines.append(f"_o{k} = {given}")
                alloc_lines.append(f"if _o{k} is None: _o{k} = {alloc}")
                alloc_lines.append(f"elif {grad_out}")
        # Allocation reads the inputs' shapes: a non-tensor argument fails
        # there, before libtefl's validation; say which one (no cost when
        # nothing is raised).
        body.append("try:")
        body += ["    " + line for line in alloc_lines]
        body.append("except (AttributeError, TypeError, IndexError) as __e:")
        ins_t = "(" + ", ".join(f"_i{j}" for j in range(len(self.ins))) + ("," if len(self.ins) == 1 else "") + ")"
        body.append(f"    _alloc_error({self.name!r}, {ins_t}, __e)")
        tup = lambda xs: "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"
        I = tup([f"_i{j}" for j in range(len(self.ins))])
        O = tup([f"_o{k}" for k in range(nout)])
        A = tup([f"_a{k}" for k in range(len(self.attrs))])
        if fused_q:
            # TE's quantizer: the op's fused FP8 variant (<op>_fp8) runs instead
            # and the main output comes back as a Float8Tensor.
            rets_q = tup([f"_o{k}" if k is not None else "None" for k in self.returns])
            body.append(f"if {quant[0]} is not None: return _quantized({self.name!r}, {quant[0]}, __call, {I}, {O}, "
                        f"{A}, __pget(), {rets_q}, {main_out!r}, __qgiven, {main_name!r})")
        body.append(f"__call(__id, {I}, {O}, {A}, __pget())" if mode == "manager" else
                    f"__call(__ref, __id, {I}, {O}, {A})")
        rets = [f"_o{k}" if k is not None else "None" for k in self.returns]
        body.append("return " + (rets[0] if len(rets) == 1 else tup(rets)))
        # libtefl's messages use the schema's names and C's NULL; say the
        # caller's names and None (a try costs nothing unless raised)
        names = self.python_names()
        body = (["try:"] + ["    " + line for line in body] +
                ["except (ValueError, TypeError) as __e:", f"    _in_python_names(__e, {names!r})", "    raise"])
        fn = self.name
        src = ["def __make(__call, __id, __ref, __pget):",
               f"    def {fn}({', '.join(sig)}):"]
        src += ["        " + line for line in body]
        src += [f"    {fn}.__qualname__ = {fn!r}", f"    return {fn}"]
        return "\n".join(src)

    def python_names(self) -> Dict[str, str]:
        """Schema name -> Python parameter name, where they differ."""
        out = {}
        for py, role, tgt in self.params:
            if role in ("in", "out", "attr", "rng") and isinstance(tgt, str) and tgt != py:
                out[tgt] = py
        return out

    def make(self, mode: str, call, ref=None, pget=None):
        key = (self.name, mode)
        factory = _FACTORIES.get(key)
        if factory is None:
            ns = dict(_HELPERS)
            exec(compile(self.source(mode), f"<tefl op {self.name}>", "exec"), ns)
            factory = _FACTORIES[key] = ns["__make"]
        f = factory(call, self.op_id, ref, pget)
        f.__doc__ = self.doc()
        return f

    def doc(self) -> str:
        s = self.schema
        lines = [f"{self.name}: {s['doc']}", "", "Parameters:"]
        for py, role, tgt in self.params:
            if role == "in":
                a = s["inputs"][self.ins.index(tgt)]
                lines.append(f"  {py}: {a['shape']} ({'|'.join(a['dtypes'])}){' optional' if a['optional'] else ''}")
            elif role in ("attr", "rng"):
                a = s["attrs"][self.attrs.index(tgt)]
                lines.append(f"  {py}: {a['type']} = {a['default']!r}: {a['doc']}")
            elif role == "out":
                lines.append(f"  {py}: optional output tensor for '{tgt}'")
            elif role == "outs":
                lines.append(f"  {py}: optional output tensor(s) ({', '.join(self.outs)})")
            elif role == "quantizer":
                lines.append(f"  {py}: None, or a tefl.Float8Quantizer for an FP8 output ({self.name}_fp8)"
                             if _has_fp8_variant(self.name) else f"  {py}: must be None ({self.name} has no FP8 variant)")
            elif role == "otype":
                lines.append(f"  {py}: dtype of '{tgt}' (DType, torch or numpy dtype; default: like the input)")
            elif role == "split3":
                lines.append(f"  {py}: [{', '.join(tgt)}]")
        rets = [self.outs[k] if k is not None else "None" for k in self.returns]
        lines.append(f"Returns: ({', '.join(rets)})")
        return "\n".join(lines)

    # ---- calling a Python implementation -----------------------------------
    def _impl_plan(self):
        """(positional input indices, [(kwarg, role, index)]) for impl_call."""
        pos, kw = [], []
        for idx, (py, role, tgt) in enumerate(self.params):
            if role == "in":
                j = self.ins.index(tgt)
                if idx < self.positional_ins:
                    pos.append(j)
                else:
                    kw.append((py, "in", j))
            elif role in ("attr", "rng"):
                k = self.attrs.index(tgt)
                kw.append((py, "bool" if self.schema["attrs"][k]["type"] == "bool" else "attr", k))
            elif role == "out":
                kw.append((py, "out", self.outs.index(tgt)))
            elif role in ("outs", "quantizer"):
                kw.append((py, "none", 0))
            elif role == "otype":
                kw.append((py, "otype", self.outs.index(tgt)))
            elif role == "split3":
                kw.append((py, "split3", tuple(self.attrs.index(a) for a in tgt)))
        return tuple(pos), tuple(kw)

    def impl_call(self, fn, inputs, outputs, attrs):
        """Calls a Python implementation with this op's Python signature and
        stores its results into `outputs`."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            plan = self._plan = self._impl_plan()
        pos, kwplan = plan
        kwargs = {}
        for py, what, k in kwplan:
            if what == "in":
                kwargs[py] = inputs[k]
            elif what == "attr":
                kwargs[py] = attrs[k]
            elif what == "bool":
                kwargs[py] = bool(attrs[k])
            elif what == "out":
                kwargs[py] = outputs[k]
            elif what == "none":
                kwargs[py] = None
            elif what == "otype":
                kwargs[py] = te_dtype_of(outputs[k])
            else:  # split3
                kwargs[py] = [attrs[i] for i in k]
        result = fn(*[inputs[j] for j in pos], **kwargs)
        if result is None:
            # Only outputs handed over (ln_out, ...) can have been written in
            # place; any other output would keep whatever its buffer held.
            handed = {k for _, what, k in kwplan if what == "out"}
            missing = [self.outs[k] for k, dst in enumerate(outputs) if dst is not None and k not in handed]
            if missing:
                raise ValueError(f"{self.name}: the implementation returned None, but output(s) "
                                 f"{', '.join(repr(m) for m in missing)} were not handed to it to write; "
                                 "return them (a tensor or a tuple)")
            return
        self.store(result, outputs)

    def store(self, result, outputs) -> None:
        if result is None:
            return  # written into the outputs it was given
        if not isinstance(result, (tuple, list)):
            result = (result,)
        n = len(outputs)
        if len(result) == len(self.returns):
            pairs = zip(self.returns, result)
        elif len(result) == n:
            pairs = zip(range(n), result)
        else:
            layout = ", ".join(self.outs[k] if k is not None else "None" for k in self.returns)
            raise ValueError(f"{self.name}: the implementation returned {len(result)} values; expected "
                             f"({layout}) or the {n} outputs ({', '.join(self.outs)})")
        for k, value in pairs:
            if k is None:
                continue
            dst = outputs[k]
            if dst is None or value is dst:
                continue
            if value is None:
                raise ValueError(f"{self.name}: the implementation returned None for output '{self.outs[k]}'")
            copy_into(dst, value, self.name, self.outs[k])


_FACTORIES: Dict[Tuple[str, str], Any] = {}
SIGNATURES: Dict[str, OpSignature] = {}
for _s in SCHEMAS:
    SIGNATURES[_s["name"]] = OpSignature(_s)
SIG_BY_ID = {sig.op_id: sig for sig in SIGNATURES.values()}


def signature_of(op: str) -> OpSignature:
    return SIGNATURES[schema_of(op)["name"]]


# ---- helpers of the generated functions ---------------------------------------------

def _is_numpy(x) -> bool:
    return isinstance(x, np.ndarray)


def _empty(ref, shape, dtype):
    if ref is None:
        raise ValueError("cannot allocate an output without its reference input")
    if isinstance(ref, np.ndarray):
        if isinstance(dtype, str):
            if dtype == "bfloat16" or dtype.startswith("float8") or dtype.startswith("float4"):
                raise TypeError(f"numpy has no dtype {dtype}; pass torch tensors")
            dtype = np.dtype(dtype)
        return np.empty(shape, dtype=dtype)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ref, torch.Tensor):
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        return ref.new_empty(shape, dtype=dtype)  # ref's device; a little cheaper than torch.empty(device=)
    raise TypeError(f"cannot allocate outputs like a {type(ref).__name__}: pass them explicitly (out=...), or use "
                    "torch tensors or numpy arrays")


def _like(ref):
    """A compact row-major tensor of ref's shape, dtype and device."""
    if isinstance(ref, np.ndarray):
        return np.empty(ref.shape, dtype=ref.dtype)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ref, torch.Tensor):
        return torch.empty_like(ref, memory_format=torch.contiguous_format)
    return _empty(ref, ref.shape, ref.dtype)


def _otype(otype, default, op=None, param="otype", allowed=None, has_quantizer=False):
    """The dtype name an otype argument asks for; one of `allowed` (the
    output's dtypes) when given."""
    if otype is None:
        return default
    try:
        name = dtype_name(otype)
    except (ValueError, TypeError, KeyError):
        name = None
    if name not in DTYPE_NAMES.values():
        raise ValueError(f"{op}: argument '{param}' expects a tefl.DType, a torch/numpy dtype or a dtype name "
                         f"({', '.join(sorted(DTYPE_NAMES.values()))}), got {otype!r}") from None
    if allowed is not None and name not in allowed:
        hint = (" (an FP8 output comes from a Float8Quantizer passed as 'quantizer')"
                if has_quantizer and name.startswith("float8") else "")
        raise ValueError(f"{op}: argument '{param}' expects one of {', '.join(allowed)}, got {name}{hint}")
    return name


_TE_DTYPE_CACHE: Dict[Any, Optional[DType]] = {}


def te_dtype_of(t) -> Optional[DType]:
    if t is None:
        return None
    dt = t.dtype
    try:
        return _TE_DTYPE_CACHE[dt]
    except KeyError:
        v = _TE_DTYPE_CACHE[dt] = NAME_TO_DTYPE.get(dtype_name(dt))
        return v


def _pick(out, k, n, op):
    if out is None:
        return None
    if n == 1 and not isinstance(out, (tuple, list)):
        return out
    if not isinstance(out, (tuple, list)) or len(out) != n:
        got = f"{len(out)} entries" if isinstance(out, (tuple, list)) else type(out).__name__
        raise ValueError(f"{op}: out= expects a tuple of {n} tensors (or None entries) in the order "
                         f"({', '.join(a['name'] for a in BY_NAME[op]['outputs'])}), got {got}")
    return out[k]


def _pick_one(op, param, named, from_out, k):
    if from_out is None or from_out is named:
        return named
    if named is None:
        return from_out
    raise ValueError(f"{op}: output {k} is given twice, as {param}= and as out[{k}], with different tensors; "
                     "pass one of them")


def _in_python_names(error, names):
    """Rewrites a libtefl validation message in place: the schema's argument
    names ('gamma') become the Python parameters' ('weight'), NULL None."""
    if not error.args or not isinstance(error.args[0], str):
        return
    text = re.sub(r"'(\w+)'", lambda m: f"'{names[m.group(1)]}'" if m.group(1) in names else m.group(0),
                  error.args[0])
    error.args = (text.replace("got NULL", "got None"),) + error.args[1:]


def _grad_out(op, param, name):
    """A caller's output that requires grad: refused while grad mode is on.
    tefl's write is not recorded by autograd (torch itself refuses in-place
    writes to a leaf that requires grad; a non-leaf's graph would silently
    hold the old value); under torch.no_grad() it is written, as torch
    writes such leaves there (optimizer steps)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.is_grad_enabled():
        which = f"argument '{param}'" if param != "out" else f"argument 'out' (output '{name}')"
        raise ValueError(f"{op}: {which}: a tensor that requires grad cannot be written "
                         f"while grad mode is on (autograd does not record tefl's write); pass one without "
                         f"requires_grad, let tefl allocate the output, or write under torch.no_grad()")


def _need_out(op, name):
    raise ValueError(f"{op}: the shape of output '{name}' cannot be inferred from the schema "
                     f"('{BY_NAME[op]['outputs'][[o['name'] for o in BY_NAME[op]['outputs']].index(name)]['shape']}'); "
                     f"pass it with out=")


def _alloc_error(op, inputs, error):
    schema = BY_NAME[op]
    for j, (arg, value) in enumerate(zip(schema["inputs"], inputs)):
        if value is None:
            if not arg["optional"]:
                raise ValueError(f"{op}: argument '{arg['name']}' (input {j}): is required, got None") from None
            continue
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"{op}: argument '{arg['name']}' (input {j}): expected a tensor (torch.Tensor, "
                            f"numpy.ndarray or another array with __dlpack__, shape and dtype), got "
                            f"{type(value).__name__}") from None
    # A fixed-rank doc ("[len, n]", two or more dims, no "...", one form) that the input's rank does not
    # match is the likely cause: name it as the op's validation would.
    from ._shapes import _bracket

    for j, (arg, value) in enumerate(zip(schema["inputs"], inputs)):
        doc = arg["shape"]
        dims = _bracket(doc)
        if value is None or dims is None or len(dims) < 2 or any("..." in d for d in dims):
            continue
        if " or " in doc or "|" in doc:
            continue
        if len(value.shape) != len(dims):
            raise ValueError(f"{op}: argument '{arg['name']}' (input {j}): expected rank {len(dims)} "
                             f"[{', '.join(dims)}], got shape {list(value.shape)}") from None
    raise ValueError(f"{op}: cannot allocate the outputs ({error}); check the inputs against the schema: "
                     + "; ".join(f"'{a['name']}' {a['shape']}" for a in schema["inputs"])) from error


def _has_fp8_variant(op: str) -> bool:
    return (op + "_fp8") in BY_NAME


def _no_quantizer(op, param, mode="manager"):
    if mode == "impl" and _has_fp8_variant(op):
        raise NotImplementedError(f"{op}: '{param}' must be None when calling one implementation; the FP8 output is "
                                  f"the op {op}_fp8 (call through the manager, or call {op}_fp8's implementation)")
    raise NotImplementedError(f"{op}: '{param}' must be None ({op} has no fused FP8 variant; quantize its output "
                              f"with tefl.quantize)")


def _quantized(op, quantizer, call, inputs, outputs, attrs, policy, returns, main, given=None, given_name=None):
    """Runs <op>_fp8 with the quantizer's scale; the quantizer's amax is
    written; returns the base op's return layout with the main output a
    Float8Tensor. `given`: the caller's main output (ln_out=, out=), which
    then receives the FP8 codes: a Float8Tensor (its scale_inv is written
    too) or a tensor of the quantizer's FP8 dtype; anything else is an
    error (it was ignored: the codes went to a fresh tensor)."""
    from ._te_api import Float8Tensor, _amax_into, _fp8_codes, _quantizer_dtype

    schema = BY_NAME[op + "_fp8"]
    fp8 = _quantizer_dtype(quantizer, op)
    ref = outputs[main]
    if given is not None:
        f8 = hasattr(given, "_data") and hasattr(given, "_scale_inv")
        data = _fp8_codes(given, f"{op}: argument '{given_name}'") if f8 else given
        have = getattr(data, "dtype", None)
        try:
            have_name = dtype_name(have)
        except (TypeError, ValueError, KeyError):
            have_name = repr(have)
        if have_name != fp8:
            raise ValueError(f"{op}: argument '{given_name}': with a quantizer the output holds {fp8} codes (a "
                             f"Float8Tensor or a {fp8} tensor, or None for a new one), got "
                             f"{type(given).__name__} of dtype {have_name}")
        z = data
        scale_inv = given._scale_inv if f8 else _empty(data, (1,), "float32")
    else:
        z = _empty(ref, tuple(ref.shape), fp8)
        scale_inv = _empty(ref, (1,), "float32")
    outs = list(outputs)
    outs[main] = z
    # Folded into quantizer.amax after the call (a running max, as TE's kernels keep it).
    amax = _empty(ref, tuple(getattr(quantizer.amax, "shape", (1,))), "float32")
    call(schema["id"], tuple(inputs) + (quantizer.scale,), tuple(outs) + (amax, scale_inv), attrs, policy)
    _amax_into(quantizer, amax)
    q = Float8Tensor(z, scale_inv, DType.kFloat8E4M3 if fp8 == "float8_e4m3fn" else DType.kFloat8E5M2)
    if given is not None and hasattr(given, "_data") and hasattr(given, "_scale_inv"):
        given._fp8_dtype = q._fp8_dtype
        q = given
    return tuple(q if r is ref else r for r in returns) if isinstance(returns, tuple) and len(returns) > 1 else q


_ATTR_KIND = {"f32": "a number", "i32": "an integer", "bool": "a bool", "u64": "an integer"}


def _attr_none(op, param, kind, default):
    raise TypeError(f"{op}: argument '{param}' expects {_ATTR_KIND.get(kind, 'a value')}, got None "
                    f"(leave it out for the default, {default!r})")


def _split3(op, param, value):
    if value is None or len(value) != 3:
        raise ValueError(f"{op}: '{param}' expects [q_split, k_split, v_split], got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


def _qkv_out_shape(qkv, q_split, k_split, v_split, k):
    """fused_qkv_rope_forward's q (k = 0), k (1) or v (2) shape, TE's: head dim d = k_split,
    [s, b, h * split / d, d]. The splits are checked first (an allocation from a bad split
    would fail in torch, or take gigabytes, before tefl's own validation could name it)."""
    op = "fused_qkv_rope_forward"
    splits = {"q_split": q_split, "k_split": k_split, "v_split": v_split}
    for name, v in splits.items():
        if not 1 <= v <= 2**31 - 1:
            raise ValueError(f"{op}: attribute '{name}' must be in [1, 2147483647], got {v}")
    shape = tuple(qkv.shape)
    if len(shape) != 4:
        raise ValueError(f"{op}: argument 'qkv' (input 0): expected rank 4 [s, b, h, q_split + k_split + v_split] "
                         f"(bshd [b, s, ...]), got shape {list(shape)}")
    if shape[3] != q_split + k_split + v_split:
        raise ValueError(f"{op}: argument 'qkv' (input 0): expected last dim q_split + k_split + v_split = "
                         f"{q_split + k_split + v_split}, got shape {list(shape)}")
    d = k_split
    for name, v in splits.items():
        if v % d:
            raise ValueError(f"{op}: attribute '{name}' = {v} must be a multiple of the head dim d = k_split = {d} "
                             f"(pass q, k, v with out= for another head dim)")
    split = (q_split, k_split, v_split)[k]
    return (shape[0], shape[1], shape[2] * (split // d), d)


def _prod(xs) -> int:
    return math.prod(xs)


def _gemm_float(dtype):
    """generic_gemm's pre-GELU / bias-gradient dtype: A's when a float, else float32."""
    name = dtype_name(dtype)
    return "float32" if name.startswith("float8") else name


# Dropout randomness: when no seed is given, each call draws one from the
# framework's default generator (torch's for torch tensors, numpy's global
# one otherwise), so torch.manual_seed / numpy.random.seed make runs
# reproducible and successive calls differ; the Philox offset is then 0.
def _dropout_rng(ref, seed, offset):
    if seed is None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(ref, torch.Tensor):
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        else:
            seed = int(np.random.randint(0, np.iinfo(np.int64).max, dtype=np.int64))
    if offset is None:
        offset = 0
    return seed, offset


def copy_into(dst, value, op, name):
    """Stores an implementation's result into a preallocated output."""
    dshape = tuple(dst.shape)
    vshape = tuple(getattr(value, "shape", ()))
    if vshape != dshape:
        if math.prod(vshape) != math.prod(dshape):
            raise ValueError(f"{op}: the implementation returned shape {list(vshape)} for output '{name}', "
                             f"expected {list(dshape)}")
        value = value.reshape(dshape)
    if isinstance(dst, np.ndarray):
        np.copyto(dst, np.asarray(value), casting="unsafe")
        return
    torch = sys.modules["torch"]
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(np.asarray(value))
    elif value.requires_grad:
        value = value.detach()
    dst.copy_(value)  # outputs tefl allocates never require grad


_HELPERS = {
    "_in_python_names": _in_python_names,
    "_empty": _empty,
    "_like": _like,
    "_otype": _otype,
    "_pick": _pick,
    "_pick_one": _pick_one,
    "_need_out": _need_out,
    "_grad_out": _grad_out,
    "_no_quantizer": _no_quantizer,
    "_quantized": _quantized,
    "_alloc_error": _alloc_error,
    "_split3": _split3,
    "_attr_none": _attr_none,
    "_prod": _prod,
    "_qkv_out_shape": _qkv_out_shape,
    "_gemm_float": _gemm_float,
    "_dropout_rng": _dropout_rng,
}
