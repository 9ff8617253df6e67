"""Op kinds: one ``Kind`` object per kind of op, registered once in ``KINDS``.

An ``OpSpec`` names its kind (``spec.kind``) and reaches its Kind as ``spec.strategy``; what
differs from one kind to another is there, as data and small functions, and the other modules ask
it instead of testing kind names:

* how it derives and lowers: ``elementwise`` (a max/min of pieces of the named inputs, derive.py,
  an ElementwiseKernel), a window's extremum (derive.py, a WindowKernel of the kind's windows),
  ``special`` (no max/min of pieces: derive_special.py, lower.lower_special, docs_special.py) or
  ``expression`` (expr.py);
* which lowering of ``lower.LOWERINGS`` makes its kernel (``lowering``), the form of its windows
  in the lowered WindowKernel (``windows``: what the windows are, lower.WINDOW_FORMS), whether
  they never overlap (``disjoint``), may overlap (``overlaps``) or are known only at run time
  (``runtime_windows``), which conventions apply to its sums (``grad_orders``, ``tangent_sums``);
* its window: ``window_size(params)``, whether it is ``static`` (known when the code is generated,
  bounded by ops.MAX_WINDOW through ``window_param``), the check a representative window adds;
* which settings it refuses (``settings``) and whether a preset decides how padding takes part;
* how the CLI and the generated docstrings describe its windows and its backward;
* its docs page: the paragraph on its windows and its worked example's windows.

One module per kind (``special`` holds unpooling and logsumexp, ``elementwise`` the expressions
too); ``base`` has the ``Kind`` object and what kinds share.  Adding an op kind: its module here
and its line in KINDS, its specs in ops.py (and catalog.toml), its templates and their contexts in
each backend.  Param kinds (ints, float, ...) and derivation node kinds (max, min, smooth) are not
op kinds.  This package imports no other symgrad module but policy and geometry: ops.py imports it.
"""

from __future__ import annotations

from .adaptive import ADAPTIVE
from .base import REPRESENTATIVE_REDUCTION_WINDOW, Kind  # noqa: F401
from .elementwise import ELEMENTWISE, EXPRESSION
from .fractional import FRACTIONAL, FRACTIONAL_WINDOWS  # noqa: F401
from .maxout import MAXOUT
from .order import ORDER
from .pool import POOL
from .reduction import REDUCTION
from .segment import SEGMENT
from .special import LOGSUMEXP, UNPOOL

KINDS: dict[str, Kind] = {k.name: k for k in (ELEMENTWISE, EXPRESSION, POOL, MAXOUT, FRACTIONAL,
                                              REDUCTION, ADAPTIVE, UNPOOL, LOGSUMEXP,
                                              SEGMENT, ORDER)}

# bags (issue 33, embedding_bag_max): windows given by offsets into gathered table rows
from .bag import BAG  # noqa: E402

KINDS[BAG.name] = BAG
from .roi import ROI  # noqa: E402

KINDS[ROI.name] = ROI
