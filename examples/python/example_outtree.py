"""Out-of-tree approach: a plugin package found through TE_FL_PLUGIN_MODULES.

    python examples/python/example_outtree.py

(the script sets TE_FL_PLUGIN_MODULES=my_vendor_plugin and TE_FL_PREFER=vendor
for itself, as `export ...` would). Expected log (stderr):
    [TE-FL core.py:... INFO] Plugin 'my_vendor_plugin' (env) registered 1 implementation(s): [rmsnorm_fwd:vendor.myvendor]
    [TE-FL manager.cpp:364 INFO] Registered impl_ids: ['default.portable', 'reference.cpp', 'vendor.myvendor']
    [TE-FL manager.cpp:422 INFO] Op 'rmsnorm_fwd' using 'vendor.myvendor' (kind=vendor, vendor=myvendor)
"""
import os
import sys

# Method 1: environment variable (the plugin package sits next to this file).
os.environ.setdefault("TE_FL_PLUGIN_MODULES", "my_vendor_plugin")
os.environ.setdefault("TE_FL_PREFER", "vendor")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import tefl  # noqa: E402

input = torch.randn(4, 1024, dtype=torch.bfloat16)
weight = torch.ones(1024, dtype=torch.bfloat16)
# Every catalogue op is a function of the package, through the default manager.
output, _, rsigma = tefl.rmsnorm_fwd(input, weight, 1e-5, None, None, None, 0, False)

manager = tefl.get_default_manager()
print(f"rmsnorm_fwd ran on '{manager.get_selected_impl_id('rmsnorm_fwd')}': output {tuple(output.shape)} "
      f"{output.dtype}, rsigma {tuple(rsigma.shape)} {rsigma.dtype}")
print("discovered plugins:", [(p["name"], p["source"], p["loaded"]) for p in tefl.get_discovered_plugin()])
