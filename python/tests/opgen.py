"""Valid inputs for any catalogue op, built from its schema's shape docs
(with a few family rules for ops whose shapes relate through attributes)."""
import re

import numpy as np
import torch

from tefl._ops import SIGNATURES

SIZES = {"N": 15, "H": 24, "b": 2, "h": 3, "sq": 5, "sk": 7, "attn_batches": 6, "s": 6, "d": 16, "s_max": 8, "d2": 8,
         "n": 4, "len": 3, "M": 5}
LEAD = (3, 5)


def _shape(doc, made, names):
    doc = doc.strip()
    m = re.match(r"^like\s+(\w+)", doc)
    if m and m.group(1) in made:
        return tuple(made[m.group(1)].shape)
    if doc.startswith("any shape") or doc.startswith("[any"):
        return (3, 5, 8)
    if not doc.startswith("["):
        raise ValueError(f"no generator for shape doc {doc!r}")
    toks = [t.strip() for t in doc[1:doc.index("]")].split(",")]
    out = []
    for t in toks:
        if t.endswith("..."):
            out.extend(LEAD)
        elif re.match(r"^\d+$", t):
            out.append(int(t))
        elif re.match(r"^(\d+)\s*\*?\s*(\w+)$", t):
            k, sym = re.match(r"^(\d+)\s*\*?\s*(\w+)$", t).groups()
            out.append(int(k) * SIZES[sym])
        elif " or " in t:
            out.append(SIZES[t.split(" or ")[0].strip()])
        elif t in SIZES:
            out.append(SIZES[t])
        else:
            raise ValueError(f"no size for {t!r} in {doc!r}")
    return tuple(out)


def _tensor(shape, dtype, gen):
    if dtype == "uint8":
        return torch.randint(0, 2, shape, dtype=torch.uint8, generator=gen)
    if dtype in ("int32", "int64"):
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    t = torch.randn(shape, generator=gen, dtype=torch.float32)
    return t.to(getattr(torch, dtype))


def _rope(schema, dtype, gen):
    fwd = schema["name"] == "fused_rope_forward"
    x = _tensor((6, 2, 3, 16), dtype, gen)
    freqs = torch.rand((8, 1, 1, 8), generator=gen) * 6.28
    return {("output_grads" if not fwd else "input"): x, "freqs": freqs}, {}


def _qkv_rope(schema, dtype, gen):
    freqs_q = torch.rand((8, 1, 1, 8), generator=gen) * 6.28
    freqs_k = torch.rand((8, 1, 1, 8), generator=gen) * 6.28
    kw = {"qkv_split_arg_list": [16, 8, 8]}
    if schema["name"] == "fused_qkv_rope_forward":
        return {"qkv": _tensor((6, 2, 2, 32), dtype, gen), "q_freqs": freqs_q, "k_freqs": freqs_k}, kw
    return {"q_grads": _tensor((6, 2, 4, 8), dtype, gen), "k_grads": _tensor((6, 2, 2, 8), dtype, gen),
            "v_grads": _tensor((6, 2, 2, 8), dtype, gen), "q_freqs": freqs_q, "k_freqs": freqs_k}, kw


def _gemm(schema, dtype, gen):
    # row-major generic_gemm: D[5, 6] = A[5, 7] B[7, 6] + bias
    return {"A": _tensor((5, 7), dtype, gen), "B": _tensor((7, 6), dtype, gen), "bias": _tensor((6,), dtype, gen)}, {}


def _grouped_gemm(schema, dtype, gen):
    splits = torch.tensor([2, 0, 3], dtype=torch.int64)  # an empty group in the middle
    return {"A": _tensor((5, 7), dtype, gen), "B": _tensor((3, 7, 6), dtype, gen), "m_splits": splits}, {}


def _attention(schema, dtype, gen):
    # sbhd (the default format), GQA 4:2, d_qk 16, d_v 8, sq 5, sk 7
    q, k, v = _tensor((5, 2, 4, 16), dtype, gen), _tensor((7, 2, 2, 16), dtype, gen), _tensor((7, 2, 2, 8), dtype, gen)
    if schema["name"] == "fused_attn_fwd":
        return {"q": q, "k": k, "v": v}, {}
    # the saved tensors of a forward: o and the log-sum-exp statistics, in float64
    qf, kf, vf = (t.to(torch.float64).permute(1, 2, 0, 3) for t in (q, k, v))  # [b, h, s, d]
    kf, vf = kf.repeat_interleave(2, dim=1), vf.repeat_interleave(2, dim=1)
    scores = qf @ kf.transpose(-1, -2) / 4.0  # default scale 1/sqrt(16)
    stats = torch.logsumexp(scores, dim=-1)
    o = (torch.softmax(scores, dim=-1) @ vf).permute(2, 0, 1, 3).to(q.dtype).contiguous()
    return {"q": q, "k": k, "v": v, "o": o, "d_o": _tensor(tuple(o.shape), dtype, gen),
            "stats": stats.to(torch.float32).contiguous()}, {}


FAMILY = {"fused_rope_forward": _rope, "fused_rope_backward": _rope, "fused_qkv_rope_forward": _qkv_rope,
          "fused_qkv_rope_backward": _qkv_rope, "generic_gemm": _gemm, "te_general_grouped_gemm": _grouped_gemm,
          "fused_attn_fwd": _attention, "fused_attn_bwd": _attention}
EXTRA_KW = {"dropout_fwd": {"dropout_probability": 0.3, "seed": 7, "offset": 0},
            "dropout_bwd": {"dropout_probability": 0.3}}


def has_fp8(schema) -> bool:
    """Whether a call needs float8 tensors (numpy has no float8 dtypes)."""
    return any(all(d.startswith("float8") for d in a["dtypes"])
               for a in schema["inputs"] + schema["outputs"] if not a["optional"])


def make_call(schema, dtype="float32", lib="torch", seed=0):
    """(kwargs for tefl.<op>, {input name: tensor}) for a valid call."""
    gen = torch.Generator().manual_seed(seed)
    sig = SIGNATURES[schema["name"]]
    if schema["name"] in FAMILY:
        made, kw = FAMILY[schema["name"]](schema, dtype, gen)
    else:
        made, kw = {}, {}
        pending = [a for a in schema["inputs"] if not a["optional"]]
        for _ in range(len(pending) + 1):  # "like X" may name a later input
            for a in list(pending):
                try:
                    shape = _shape(a["shape"], made, [])
                except (KeyError, ValueError):
                    if re.match(r"^\s*like\s+\w+", a["shape"]):
                        continue
                    raise
                dt = dtype if dtype in a["dtypes"] else a["dtypes"][0]
                made[a["name"]] = _tensor(shape, dt, gen)
                pending.remove(a)
        if pending:
            raise ValueError(f"no generator for {[a['name'] for a in pending]}")
    kw.update(EXTRA_KW.get(schema["name"], {}))
    if lib == "numpy":
        made = {k: v.numpy() for k, v in made.items()}
    for py, role, tgt in sig.params:
        if role == "in" and tgt in made:
            kw[py] = made[tgt]
    return kw, made


def as_np(t):
    if t is None:
        return None
    if isinstance(t, np.ndarray):
        return t.astype(np.float64)
    return t.detach().to(torch.float64).numpy()
