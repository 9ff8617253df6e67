"""symgrad: derive the backward of max-like ops under an explicit tie policy, generate the code."""

__version__ = "0.1.0"

from .api import derive, generate, list_ops, load  # noqa: E402
from .api import derive_expr, generate_expr, load_expr  # noqa: E402
from .check import check  # noqa: E402
from .policy import DEFAULT_POLICY, POLICIES  # noqa: E402

__all__ = ["load", "derive", "generate", "list_ops", "load_expr", "derive_expr", "generate_expr",
           "check", "POLICIES", "DEFAULT_POLICY", "__version__"]
