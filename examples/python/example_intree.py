"""In-tree approach (3 steps): TE-FL's example, on tefl.

Switching from TE-FL is the import line: `from tefl import ...` instead of
`from transformer_engine.plugin.core import ...`.

    python examples/python/example_intree.py

Expected log (stderr):
    [TE-FL manager.cpp:364 INFO] Registered impl_ids: ['default.portable', 'reference.cpp', 'vendor.mybackend']
    [TE-FL manager.cpp:422 INFO] Op 'rmsnorm_fwd' using 'vendor.mybackend' (kind=vendor, vendor=mybackend)
"""
import torch

from tefl import PREFER_VENDOR, BackendImplKind, OpImpl, OpManager, OpRegistry, with_preference


# 1. Define your operator implementation
def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
    variance = input.pow(2).mean(-1, keepdim=True)
    return input * torch.rsqrt(variance + eps) * weight, torch.rsqrt(variance + eps)


# 2. Register to Registry
registry = OpRegistry()
registry.register_impl(OpImpl(
    op_name="rmsnorm_fwd",
    impl_id="vendor.mybackend",
    kind=BackendImplKind.VENDOR,
    vendor="mybackend",
    fn=my_rmsnorm,
    priority=200,
))

# 3. Call via Manager (TE's rmsnorm_fwd returns (y, None, rsigma)). tefl's
# portable default ('default.portable', kind flagos) always exists, so ask for
# the vendor kind first, as `export TE_FL_PREFER=vendor` would.
manager = OpManager(registry)
input = torch.randn(4, 1024)
weight = torch.randn(1024)
with with_preference(PREFER_VENDOR):
    output, _, rsigma = manager.call("rmsnorm_fwd", input, weight)

# The same call on the built-in reference implementation, run alone.
reference = registry.get_implementation("rmsnorm_fwd", "reference.cpp")
ref_output, _, ref_rsigma = reference.fn(input, weight)
print(f"rmsnorm_fwd ran on '{manager.get_selected_impl_id('rmsnorm_fwd')}': output {tuple(output.shape)}, "
      f"rsigma {tuple(rsigma.shape)}")
print(f"max |mybackend - reference.cpp| = {(output - ref_output).abs().max().item():.3g}")
