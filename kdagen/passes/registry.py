"""Imports every pass module so that each registers itself by name."""
from . import builtin  # noqa: F401
from . import stable_reassociate  # noqa: F401
from . import autodiff_pass  # noqa: F401
from . import partition  # noqa: F401
from . import warp_specialize  # noqa: F401


# The allowed values of the built-in passes' options, checked when a pipeline is parsed
# (kdagen.passes.base.make_pass) rather than when the pass runs; the passes check them again.
from .partition import _WORKSPACE_TYPES, PartitionPass  # noqa: E402
from .stable_reassociate import StableReassociatePass  # noqa: E402
from .warp_specialize import WarpSpecializePass  # noqa: E402

PartitionPass.option_choices = {"workspace_dtype": ("auto", *_WORKSPACE_TYPES)}
WarpSpecializePass.option_min = {"depth": 1, "consumer_warpgroups": 1, "smem_budget": 0,
                                 "reserved_smem": 0, "producer_registers": 1,
                                 "consumer_registers": 1}
StableReassociatePass.option_min = {"max_exponent": 0, "subblock": 0}
