#!/usr/bin/env python3
"""Paired timing of tefl's fused_attn_fwd/bwd (through the C ABI, ctypes,
default policy: default.portable) and torch 2.13 CPU SDPA in ONE process,
alternating calls, so both see the same machine load (the machine is shared
and its load drifts). b = 2, h = 16; tefl gets bshd [b, s, h, d], torch
contiguous [b, h, s, d]; torch.set_num_threads(2), tefl's pool 2 threads.

Per case and pass: --rounds alternating timed calls of each after a warm-up;
prints medians (ms) and torch / tefl (> 1: tefl faster). torch's backward is
the median of (forward + backward) minus the median of the grad-enabled
forward, both timed in the same alternation.

Usage: python3 bench/attention_paired.py [--lib build/release/libtefl.so]
       [--rounds 5] [--cases fp32/s2048/d64/full,...] [--json]
"""
import argparse
import ctypes
import json
import statistics
import time

import torch
import torch.nn.functional as F
from tefl_ctypes import bind, dl, load

B, H = 2, 16


class Attrs(ctypes.Structure):  # tefl_attention_attrs
    _fields_ = [("struct_size", ctypes.c_size_t), ("qkv_format", ctypes.c_int32), ("mask_type", ctypes.c_int32),
                ("window_left", ctypes.c_int32), ("window_right", ctypes.c_int32), ("softmax_type", ctypes.c_int32),
                ("scale", ctypes.c_float), ("dropout", ctypes.c_float), ("is_training", ctypes.c_int32),
                ("seed", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


def parse_case(ap, case):
    """'fp32/s2048/d64/causal' -> (case, torch dtype, s, d, causal); a malformed case is an argument error."""
    parts = case.split("/")
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    ok = (len(parts) == 4 and parts[0] in dtypes and parts[1][:1] == "s" and parts[1][1:].isdigit()
          and parts[2][:1] == "d" and parts[2][1:].isdigit() and parts[3] in ("full", "causal"))
    if not ok or int(parts[1][1:]) < 1 or int(parts[2][1:]) < 1:
        ap.error(f"--cases: '{case}' is not DTYPE/sS/dD/MASK with DTYPE fp32 or bf16, S and D positive integers "
                 "and MASK full or causal (e.g. bf16/s2048/d64/causal)")
    return case, dtypes[parts[0]], int(parts[1][1:]), int(parts[2][1:]), parts[3] == "causal"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/release/libtefl.so")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="fp32/s2048/d64/full,fp32/s2048/d64/causal,fp32/s2048/d128/full,"
                    "fp32/s2048/d128/causal,bf16/s2048/d64/full,bf16/s2048/d64/causal,bf16/s2048/d128/full,"
                    "bf16/s2048/d128/causal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    cases = [parse_case(ap, c) for c in args.cases.split(",")]
    torch.set_num_threads(2)
    lib = load(args.lib)
    fwd_id, bwd_id = lib.tefl_op_id(b"fused_attn_fwd"), lib.tefl_op_id(b"fused_attn_bwd")
    rows = []
    for case, dtype, s, d, causal in cases:
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.rand(B, s, H, d, generator=g).mul_(2).sub_(1).to(dtype) for _ in range(4))
        o = torch.empty_like(q)
        stats = torch.empty(B, H, s, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        keep = []
        attrs = Attrs(ctypes.sizeof(Attrs), 1, 2 if causal else 0, -1, -1, 0, 0.0, 0.0, 0, 0, 0)
        tefl_fwd = bind(lib, fwd_id, [dl(q, keep), dl(k, keep), dl(v, keep), None, None, None],
                        [dl(o, keep), dl(stats, keep)], attrs)
        tefl_bwd = bind(lib, bwd_id, [dl(q, keep), dl(k, keep), dl(v, keep), dl(o, keep), dl(do, keep),
                                      dl(stats, keep), None, None, None],
                        [dl(dq, keep), dl(dk, keep), dl(dv, keep), None], attrs)

        tq, tk, tv, tdo = (t.transpose(1, 2).contiguous() for t in (q, k, v, do))
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (tq, tk, tv))

        def timed(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3

        fns = {
            "tefl_fwd": tefl_fwd,
            "tefl_bwd": tefl_bwd,
            "torch_fwd": lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal),
            "torch_fwd_grad": lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal),
            "torch_fwd_bwd": lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal), (qg, kg, vg), tdo),
        }
        with torch.no_grad():
            fns["tefl_fwd"]()
            fns["torch_fwd"]()
        fns["tefl_bwd"]()
        fns["torch_fwd_bwd"]()
        times = {k_: [] for k_ in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                if name in ("torch_fwd",):
                    with torch.no_grad():
                        times[name].append(timed(fn))
                else:
                    times[name].append(timed(fn))
        med = {k_: statistics.median(v_) for k_, v_ in times.items()}
        torch_bwd = med["torch_fwd_bwd"] - med["torch_fwd_grad"]
        row = {"case": case, "tefl_fwd_ms": med["tefl_fwd"], "torch_fwd_ms": med["torch_fwd"],
               "fwd_ratio": med["torch_fwd"] / med["tefl_fwd"], "tefl_bwd_ms": med["tefl_bwd"],
               "torch_bwd_ms": torch_bwd, "bwd_ratio": torch_bwd / med["tefl_bwd"]}
        rows.append(row)
        if not args.json:
            print(f"{case:24s} fwd tefl {row['tefl_fwd_ms']:8.1f} torch {row['torch_fwd_ms']:8.1f} "
                  f"x{row['fwd_ratio']:.2f} | bwd tefl {row['tefl_bwd_ms']:8.1f} torch {torch_bwd:8.1f} "
                  f"x{row['bwd_ratio']:.2f}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
