#!/usr/bin/env python3
"""Repeats tefl bench and torch (preallocated .out) side by side, three times each,
for the memory-bound element-wise ops where the two are at parity: silu, relu.
usage (from the repository root, release build): python3 bench/torch_parity_repeats.py"""
import json, subprocess, time, torch
torch.set_num_threads(2)
A = torch.ops.aten
def med(fn, t=0.5):
    fn(); s=[]; st=time.perf_counter()
    while len(s) < 3 or time.perf_counter()-st < t:
        a=time.perf_counter(); fn(); s.append(time.perf_counter()-a)
    s.sort(); return s[len(s)//2]*1e3
for op, f in [("silu", lambda x,y: A.silu.out(x, out=y)), ("relu", lambda x,y: torch.clamp_min(x, 0, out=y))]:
    for dt, tdt in [("fp32", torch.float32), ("bf16", torch.bfloat16)]:
        r = []
        for rep in range(3):
            j = json.loads(subprocess.run(["build/release/tools/tefl/tefl","bench","--op",op,"--impl","default.portable","--dtype",dt,"--size","8192,4096","--min-time","0.5","--json"],capture_output=True,text=True).stdout)
            tefl = j["results"][0]["seconds"]*1e3
            x = (torch.rand(8192,4096)*8-4).to(tdt); y = torch.empty_like(x)
            th = med(lambda: f(x,y))
            r.append((tefl, th, th/tefl))
        print(op, dt, " ".join(f"tefl {a:.2f} torch {b:.2f} x{c:.2f}" for a,b,c in r), flush=True)
