"""An out-of-tree tefl plugin (TE-FL's plugin package layout).

Loaded by `export TE_FL_PLUGIN_MODULES=my_vendor_plugin`, or, once installed
with the entry point of pyproject.toml (group `te_fl.plugin`), by tefl's
entry-point discovery without any configuration.
"""
import torch

from tefl import BackendImplKind, OpImpl


def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
    # Your implementation
    rsigma = torch.rsqrt(input.float().pow(2).mean(-1, keepdim=True) + eps)
    return (input.float() * rsigma * weight.float()).to(input.dtype), rsigma


def register(registry):
    """Called automatically by tefl (transactionally: if this raises, nothing
    of the plugin stays registered)."""
    registry.register_impl(OpImpl(
        op_name="rmsnorm_fwd",
        impl_id="vendor.myvendor",
        kind=BackendImplKind.VENDOR,
        vendor="myvendor",
        fn=my_rmsnorm,
        priority=200,
    ))
