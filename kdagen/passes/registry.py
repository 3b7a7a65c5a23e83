"""Imports every pass module so that each registers itself by name."""
from . import builtin  # noqa: F401
from . import stable_reassociate  # noqa: F401
from . import autodiff_pass  # noqa: F401
from . import partition  # noqa: F401
from . import warp_specialize  # noqa: F401
