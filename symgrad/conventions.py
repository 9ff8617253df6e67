"""Framework presets: each framework's gradients at ties, kinks, NaN and inf, as data.

A preset is, per op, a tie policy, an argument order (the op's max/min form as given in ops.py, or
with every max/min's arguments reversed), a NaN rule (policy.NAN_RULES), which operand the
forward's max/min (or a window's fold) returns where two are equal (``zeros``: it decides the sign
of a zero output, since +0 == -0), for elementwise ops how the gradient's terms are put together
(``gradient``) and in which precision float16 is computed (``half``), and, for pooling, how
padding takes part.  Nothing here is code: the derivation and lowering do the rest.  Sources for
every entry: shared/reference/framework-conventions.md (PyTorch 2.13 and JAX 0.10 source lines).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    ties: str
    nan: str
    order: str = "given"
    note: str = ""  # what the framework does, and where it contradicts itself
    padding: str = "never_wins"  # pooling: "never_wins", or "neg_inf" (padding is -inf and takes part)
    # the operand each max/min step of the forward (in the order used; a window's fold) returns
    # where the two are equal, which decides the sign of a zero output (ZERO_RULES); None: NumPy's
    # np.maximum/np.max (elementwise, reductions) or the second (window folds)
    zeros: str | None = None
    # elementwise: how the gradient's terms are put together (lower.GRADIENT_FORMS: "sum",
    # "nested", "scaled", "product"), which decides the sign of a zero gradient
    gradient: str = "sum"
    # elementwise, float16 inputs: "half" (computed in float16, constants rounded to float16, as
    # NumPy does) or "float" (computed in float32 with float32 constants and rounded to float16
    # once, as PyTorch's CPU kernels of hardtanh and leaky_relu do)
    half: str = "half"
    # windows: the value every input element's gradient starts from before the terms of the
    # windows holding it are added (GRAD_STARTS), which decides the sign of a zero gradient
    grad_start: str = "+0"
    # windows, bfloat16: how an element's windows' gradients are added (BFLOAT16_ADDS)
    bfloat16_adds: str = "float32"
    # adaptive windows: the order in which an element's windows' gradients are added (GRAD_ORDERS)
    grad_order: str = "output"
    # reductions (amax/amin): how jvp (the derivative of backward in grad_output) adds a slice's
    # terms (TANGENT_SUMS)
    tangent_sum: str = "weights"
    # elementwise with broadcasting: how a broadcast input's gradient is summed back to its shape
    # (BROADCAST_SUMS)
    broadcast_sum: str = "numpy"
    # order statistics: how the framework computes what a policy alone does not say (ORDER_FORMS)
    order_form: str = ""
    # the preset of the op without dim (every element one row), where the framework differs there
    # (torch.median(x) splits, torch.median(x, dim) does not)
    whole: "Preset | None" = None
    # elementwise, a whole-bfloat16 call: the ZERO_RULES of the forward where bfloat16's differs
    # from zeros (PyTorch's bfloat16 fmax/fmin); None: zeros
    bfloat16_zeros: str | None = None


ZERO_RULES = {
    "first": "of two equal operands the first is returned (+0 and -0 included)",
    "second": "of two equal operands the second is returned (+0 and -0 included)",
    "ordered": "-0 is below +0 (IEEE 754-2019 maximum/minimum, XLA's max/min, fabs)",
}


GRAD_STARTS = {
    "+0": "+0, as a framework that adds each window's gradient into zeros (PyTorch's pooling "
          "kernels' +=, XLA's scatter-add): a zero gradient is +0",
    "-0": "-0, the identity of IEEE addition: the gradient is its terms' sum exactly, as "
          "jnp.max's g * hit / count over one group (a loser gets -0 under a negative g)",
    "slices": "-0 for an element inside every window, else +0, as jnp.max over slices of x (each "
              "window's gradient is padded with +0 to x's shape, and the windows' gradients added)",
    "written": "none: where windows do not overlap, a window's winner gets grad_output itself, "
               "written into zeros (a -0 gradient stays -0), the other elements +0, as PyTorch's "
               "max(dim) backward (zeros.scatter)",
}


GRAD_ORDERS = {
    "output": "the windows in output (row-major) order, as PyTorch's kernels add them",
    "reversed": "the last window first, each window's gradient rounded to the dtype, as JAX's "
                "autodiff adds the gradients of a function written window by window (each slice's "
                "gradient an array of the dtype; the backward pass meets the last window's first)",
}


BFLOAT16_ADDS = {
    "float32": "in float32 from +0, in output order, the sum rounded to bfloat16 once",
    "bfloat16": "from +0 in output order (row-major), each add rounded to bfloat16, as PyTorch's "
                "CPU pooling kernels (`grad_input[maxindex] += grad_output` in BFloat16) and XLA's "
                "select_and_scatter in bfloat16 add them (max pooling with one winner per window)",
}


TANGENT_SUMS = {
    "weights": "each element's weight (backward's, the tangent in place of grad_output) added up "
               "along the slice in row order",
    "torch": "sum(tangent * hit) in the order of PyTorch's CPU at::sum (SumKernel.cpp's cascade "
             "sum, 32-byte vectors), then divided by the count once, as the "
             "derivative of PyTorch's (g / count) * mask in g",
}

BROADCAST_SUMS = {
    "numpy": "NumPy's sum (pairwise) over the broadcast dims, in at least float32, rounded once",
    "torch": "the order of PyTorch's autograd, at::sum_to: one CPU at::sum over the leading and "
             "the broadcast dims (SumKernel.cpp's cascade sum in its TensorIterator's dim order, "
             "32-byte vectors), in at least float32, rounded once",
    "jax": "the order of JAX's transpose of broadcast_in_dim on the CPU: one XLA reduce over the "
           "leading and the broadcast dims (the terms of each output in row-major order from +0; a "
           "dim longer than 32 first summed in windows of 32: TreeReductionRewriter), in the "
           "gradient's dtype, each add rounded to it",
}


_POOL_TORCH = Preset("first", "last_nan", note=(
    "PyTorch max_pool*d: scan with `val > maxval || isnan(val)` (first tie in scan order wins, the "
    "last NaN wins); padding is never selected; backward `grad_input[maxindex] += grad_output` in "
    "output order, in the input's dtype"), bfloat16_adds="bfloat16")

_ADAPTIVE_TORCH = Preset("first", "last_nan", note=(
    "PyTorch adaptive_max_pool*d (CPU kernel AdaptiveMaxPoolKernel.cpp): scan from maxval = -inf, "
    "maxindex = the window's first element, with `(val > maxval) || isnan(val)` (first tie in scan "
    "order wins, the last NaN wins; a window of -inf keeps its first element); backward "
    "`grad_input[maxindex] += grad_output` in output order, in the input's dtype"),
    bfloat16_adds="bfloat16")

_FRACTIONAL_TORCH = Preset("first", "last_nan", note=(
    "PyTorch fractional_max_pool*d (CPU kernels FractionalMaxPool2d.cpp/3d.cpp): scan from maxVal = "
    "-inf, maxIndex = the window's first element, with `val > maxVal || isnan(val)` (first tie in "
    "scan order wins, the last NaN wins); backward `gradInput[index] += gradOutput` in output "
    "order, in the input's dtype"), bfloat16_adds="bfloat16")

TORCH = {
    "maximum": Preset("split", "each", zeros="first", note=(
        "torch.maximum: where(a == b, g/2, g), 0 where a < b: a tie is split 1/2-1/2, and a NaN "
        "operand gives BOTH operands the whole g. Forward of +0 and -0: the scalar code path "
        "returns the first operand, SIMD lanes the second (PyTorch contradicts itself); this "
        "preset follows the scalar path. A broadcast input's gradient: at::sum_to's order"),
        broadcast_sum="torch"),
    "minimum": Preset("split", "each", zeros="first", broadcast_sum="torch",
                      note="torch.minimum: as maximum, mirrored"),
    "fmax": Preset("first", "lose", zeros="first", broadcast_sum="torch", note=(
        "torch.fmax: a gets g where a >= b or isnan(b), b gets g elsewhere (masked_fill, +0 "
        "otherwise): a tie goes to a, a NaN loses to a number, a gets g where both are NaN; forward "
        "returns the first of +0 and -0 (in the SIMD lanes too), in bfloat16 the second (at every "
        "position and length). Forward mode (jvp) gives a tie to b instead: PyTorch contradicts "
        "itself; this preset follows reverse mode"), bfloat16_zeros="second"),
    "fmin": Preset("first", "lose", zeros="first", broadcast_sum="torch", note=(
        "torch.fmin: as fmax, mirrored (a gets g where a <= b or isnan(b)); its forward mode "
        "agrees (a tie to a)"), bfloat16_zeros="second"),
    "relu": Preset("last", "keep", "reversed", gradient="nested", zeros="first", note=(
        "F.relu: threshold_backward(g, result, 0) = result <= 0 ? 0 : g: 0 at 0, g at NaN; written "
        "max(x, 0), last; forward x < 0 ? 0 : x (relu(-0) is -0)")),
    "clamp": Preset("last", "keep", "reversed", gradient="nested", zeros="second", note=(
        "torch.clamp: where(x >= min & x <= max, g, 0): 1 at both bounds, 0 at NaN; written "
        "min(max, max(min, x)), last; forward keeps x where it equals a bound (clamp(-0, 0) is -0)")),
    "hardtanh": Preset("last", "keep", gradient="nested", half="float", zeros="first", note=(
        "F.hardtanh: (x <= min || x >= max) ? 0 : g: 0 at both bounds. PyTorch's CPU kernel "
        "contradicts itself on NaN (0 in SIMD lanes, g in the scalar tail); this preset follows the "
        "scalar code path (g at NaN), as torch._decomp's hardtanh_backward does")),
    "relu6": Preset("last", "keep", gradient="nested", half="float", zeros="first", note=(
        "F.relu6 = hardtanh(0, 6): 0 at 0 and 6; on NaN PyTorch's CPU kernel gives 0 or g by SIMD "
        "lane; this preset follows the scalar code path (g at NaN)")),
    "leaky_relu": Preset("first", "keep", "reversed", gradient="nested", half="float", zeros="first", note=(
        "F.leaky_relu: x > 0 ? g : g*slope: the slope at 0 and at NaN; written max(slope*x, x) "
        "(min for slope > 1), first; forward x > 0 ? x : x*slope (slope*x at 0). A slope of 0 is "
        "x*0 and g*0 (NaN at x = -inf and for an infinite g, -0 for x < 0), not relu")),
    "abs": Preset("split", "zero", gradient="product", zeros="ordered", note=(
        "torch.abs: g * sgn(x): 0 at 0 and -0, 0 at NaN; forward fabs (+0 at -0)")),
    "amax": Preset("split", "nan", tangent_sum="torch", zeros="first", note=(
        "torch.amax: (g / count) * mask: a tie is split evenly; a slice holding NaN gets NaN "
        "everywhere; of tied +0 and -0 the first zero, as its scalar path (rows shorter than two "
        "SIMD vectors; longer rows fold in lanes, whose zero depends on the positions)")),
    "amin": Preset("split", "nan", tangent_sum="torch", zeros="first", note="torch.amin: as amax"),
    "max": Preset("split", "dominate", note=(
        "torch.max(x) without dim: evenly_distribute_backward: g / count to each element equal to "
        "the max, and where the max is NaN, g / count to each NaN element (0 elsewhere): the NaNs "
        "tie; torch.amax(x) gives NaN everywhere instead; of tied +0 and -0 the last zero, as its "
        "short rows (up to 4 float64, 7 float32 elements; longer rows fold in lanes)"), zeros="second"),
    "min": Preset("split", "dominate", zeros="second", note="torch.min(x) without dim: as torch.max(x)"),
    "max_pool1d": _POOL_TORCH,
    "max_pool2d": _POOL_TORCH,
    "max_pool3d": _POOL_TORCH,
    "adaptive_max_pool1d": _ADAPTIVE_TORCH,
    "adaptive_max_pool2d": _ADAPTIVE_TORCH,
    "adaptive_max_pool3d": _ADAPTIVE_TORCH,
    "fractional_max_pool2d": _FRACTIONAL_TORCH,
    "fractional_max_pool3d": _FRACTIONAL_TORCH,
    "maxout": Preset("first", "dominate", grad_start="written", note=(
        "PyTorch has no maxout; this is x.view(N, C/pieces, pieces, ...).max(2) (max(dim) returns the "
        "first maximal index, and the first NaN, and its backward writes grad_output to it); "
        ".amax(2) would split instead")),
}

_POOL_JAX = Preset("first", "replace", note=(
    "JAX reduce_window max VJP (select_and_scatter with ge): the running winner is replaced unless "
    "it is >= the next element, so ties go to the first element and after a NaN the selection "
    "restarts (the gradient goes to the first maximum after the last NaN, while the output is NaN); "
    "padding is -inf and takes part, so in an all -inf window next to padding the padding wins and "
    "the gradient is dropped. JAX has no VJP for dilated max pooling; forward XLA max (-0 below "
    "+0); backward adds in output order in the input's dtype"), padding="neg_inf", zeros="ordered",
    bfloat16_adds="bfloat16")

_ADAPTIVE_JAX = Preset("split", "nan", note=(
    "JAX has no adaptive max pooling; this is jnp.max over each of PyTorch's windows, x sliced (as "
    "one writes it in JAX): a tie is split evenly, a window holding NaN gives NaN to every element; "
    "forward XLA max (-0 below +0); each slice's gradient is padded with +0, and the slices' "
    "gradients are added last window first"), zeros="ordered", grad_start="slices",
    grad_order="reversed")

_FRACTIONAL_JAX = Preset("split", "nan", note=(
    "JAX has no fractional max pooling; this is jnp.max over each of PyTorch's windows (as one "
    "writes it in JAX): a tie is split evenly, a window holding NaN gives NaN to every element; "
    "forward XLA max (-0 below +0)"), zeros="ordered")

JAX = {
    "maximum": Preset("split", "zero", gradient="product", zeros="ordered", note=(
        "jnp.maximum: _balanced_eq: 1/2 each at a tie, 0 to both when either is NaN; forward "
        "XLA max (-0 below +0)")),
    "minimum": Preset("split", "zero", gradient="product", zeros="ordered",
                      note="jnp.minimum: as maximum"),
    "fmax": Preset("last", "lose", zeros="second", note=(
        "jnp.fmax: where((a > b) | isnan(b), a, b): a tie goes to b, a NaN loses to a number, a "
        "gets g where both are NaN (the scan reading of 'lose' under last); forward returns the "
        "second of +0 and -0")),
    "fmin": Preset("last", "lose", zeros="second", note=(
        "jnp.fmin: where((a < b) | isnan(b), a, b): as fmax, mirrored")),
    "relu": Preset("first", "keep", gradient="nested", zeros="ordered", note=(
        "jax.nn.relu: custom_jvp select(x > 0, g, 0): 0 at 0 and NaN; forward maximum(x, 0) (+0 at "
        "-0)")),
    "clamp": Preset("split", "zero", gradient="product", zeros="ordered", note=(
        "jnp.clip = minimum(max, maximum(min, x)): 1/2 at a bound, 0 at NaN")),
    "hardtanh": Preset("first", "keep", gradient="nested", zeros="first", note=(
        "jax.nn.hard_tanh: where(x > 1, 1, where(x < -1, -1, x)): 1 at both bounds and at NaN; x "
        "where it equals a bound")),
    "relu6": Preset("first", "keep", "reversed", gradient="nested", zeros="ordered", note=(
        "jax.nn.relu6: custom_jvp (x > 0) & (x < 6): 0 at 0, 6 and NaN; written min(6, max(0, x)), "
        "first; forward minimum(maximum(x, 0), 6) (+0 at -0)")),
    "leaky_relu": Preset("last", "keep", "reversed", gradient="scaled", zeros="second", note=(
        "jax.nn.leaky_relu: where(x >= 0, x, slope*x): 1 at 0, the slope at NaN; written "
        "max(slope*x, x), last (x at 0). A slope of 0 is x*0 and 0*(c ? 0 : g) (NaN at x = -inf "
        "and for an infinite g, -0 for x < 0), not relu")),
    "abs": Preset("last", "keep", "reversed", gradient="scaled", zeros="ordered", note=(
        "jnp.abs: select(x >= 0, g, 0) - select(x >= 0, 0, g): +1 at 0 and -0, -1 at NaN; written "
        "max(-x, x), last; forward fabs (+0 at -0)")),
    "amax": Preset("split", "nan", zeros="ordered", note=(
        "jnp.max: sum(g * eq(x, ans)) / count: split evenly, NaN for a slice holding NaN; forward "
        "XLA max (-0 below +0)")),
    "amin": Preset("split", "nan", zeros="ordered", note="jnp.min: as jnp.max"),
    "max": Preset("split", "nan", zeros="ordered", note=(
        "jnp.max(x) over every element: as amax (JAX has one max); forward XLA max (-0 below +0)")),
    "min": Preset("split", "nan", zeros="ordered", note="jnp.min(x) over every element: as amin"),
    "max_pool1d": _POOL_JAX,
    "max_pool2d": _POOL_JAX,
    "max_pool3d": _POOL_JAX,
    "adaptive_max_pool1d": _ADAPTIVE_JAX,
    "adaptive_max_pool2d": _ADAPTIVE_JAX,
    "adaptive_max_pool3d": _ADAPTIVE_JAX,
    "fractional_max_pool2d": _FRACTIONAL_JAX,
    "fractional_max_pool3d": _FRACTIONAL_JAX,
    "maxout": Preset("split", "nan", zeros="ordered", grad_start="-0", note=(
        "JAX has no maxout; this is jnp.max over each group of channels (split evenly, NaN for a "
        "group holding NaN; -0 below +0); each element's gradient is its group's g * hit / count "
        "(-0 for a loser under a negative g)")),
}

_UNPOOL_TORCH = Preset("all", "dominate", note=(
    "F.max_unpool*d: forward scatters (the CPU kernel writes in row-major order, so of duplicate "
    "indices the last write stays; on CUDA the order is undefined); backward is a gather, "
    "grad_input = grad_output.flat[indices], so every writer of a slot gets the slot's gradient"))
_LSE_TORCH = Preset("split", "nan", note=(
    "torch.logsumexp: amax shifted out (0 where it is infinite), log(sum(exp(x - m))) + m; "
    "backward g * exp(x - result): NaN for an all -inf slice, at +inf and for a slice holding NaN"))
TORCH.update({"max_unpool1d": _UNPOOL_TORCH, "max_unpool2d": _UNPOOL_TORCH,
              "max_unpool3d": _UNPOOL_TORCH, "logsumexp": _LSE_TORCH})
_UNPOOL_JAX = Preset("last", "dominate", note=(
    "JAX has no max_unpool; this is zeros.at[indices].set(input) (as one writes it in JAX): of "
    "duplicate indices the last write in row-major order stays, and scatter's JVP (which scatters "
    "the writers' ids and gathers them back) credits only that writer; the others get 0"))
JAX.update({"max_unpool1d": _UNPOOL_JAX, "max_unpool2d": _UNPOOL_JAX, "max_unpool3d": _UNPOOL_JAX,
            "logsumexp": Preset("split", "nan", note=(
                "jax.nn.logsumexp: max shifted out (0 where it is not finite); gradient "
                "softmax(x) * g, NaN for a slice holding NaN"))})

# segment and scatter max/min (issue 33; kinds/segment.py's FRAMEWORK_RULES say how each counts)
_SCATTER_TORCH = Preset("split", "nan", zeros="first", note=(
    "Tensor.scatter_reduce(dim, index, src, 'amax'/'amin', include_self): forward std::max from "
    "self (or from the identity, include_self=False) in index order, NaN propagating (each NaN src "
    "takes over: the output is the segment's last NaN, bits and all, on the CPU), the first of "
    "equals kept; backward N = (self == result) + scatter_add(src == result), grad_src = "
    "(src == result[index]) * (g / N)[index], grad_self = (self == result) * g / N (+0 where "
    "include_self=False and scattered): split, NaN everywhere in a segment holding NaN. Tie bug "
    "reproduced: with include_self=False the excluded self is still counted in N where it equals "
    "the result"))
_SEGMENT_TORCH = Preset("split", "nan", zeros="first", note=(
    "PyTorch has no segment_max; this is torch.full((num_segments, ...), -inf).scatter_reduce(0, "
    "segment_ids, data, 'amax') (include_self: the -inf fill is counted where a segment's max is "
    "-inf)"))
_SEGMENT_JAX = Preset("split", "zero", zeros="ordered", note=(
    "jax.ops.segment_max: scatter-max into a -inf fill (-0 below +0); its JVP gives each hit "
    "g * (1 / count), count the hits plus 1 where the fill equals the result (a segment whose max "
    "is -inf), and a segment holding NaN no gradient (0 to every element); its NaN output is one "
    "of the segment's NaNs by XLA's SIMD lanes (here its first, bits and all)"))
_SCATTER_JAX = Preset("split", "zero", zeros="ordered", note=(
    "JAX has no scatter_reduce; this is jax.ops.segment_max's rule (g * (1 / count), no gradient in "
    "a segment holding NaN) with input[j] as segment j's initial element: its src gradients are "
    "those of input.at[index].max(src), whose gradient to input (from scatter-max's JVP, "
    "(-1 + 1 / count) / refs added per ref) is not reproduced"))
TORCH.update({"scatter_max": _SCATTER_TORCH, "scatter_min": _SCATTER_TORCH,
              "segment_max": _SEGMENT_TORCH, "segment_min": _SEGMENT_TORCH})
JAX.update({"segment_max": _SEGMENT_JAX, "segment_min": _SEGMENT_JAX,
            "scatter_max": _SCATTER_JAX, "scatter_min": _SCATTER_JAX})
# CSR segments (torch_scatter's segment_max_csr): the rule of segment_max over the ids indptr gives
_CSR_TORCH = dataclasses.replace(_SEGMENT_TORCH, note=(
    "torch.full((len(indptr) - 1, ...), -inf).scatter_reduce(0, ids, src, 'amax'), ids the "
    "segment of each src row, as segment_max. PyTorch's own CSR form, torch.segment_reduce(src, "
    "'max', offsets=indptr), is not reproduced: its backward divides a tie's gradient by the "
    "count only where the gradient is positive (g = 2 over a 3-way tie gives 2/3 to each, "
    "g = -3 gives -3 to each), which is not linear in g"))
_CSR_JAX = dataclasses.replace(_SEGMENT_JAX, note=(
    "jax.ops.segment_max(src, ids, len(indptr) - 1), ids the segment of each src row: "
    + _SEGMENT_JAX.note.split(": ", 1)[1]))
TORCH.update({"segment_max_csr": _CSR_TORCH, "segment_min_csr": _CSR_TORCH})
JAX.update({"segment_max_csr": _CSR_JAX, "segment_min_csr": _CSR_JAX})

PRESETS = {"torch": TORCH, "jax": JAX}
CONVENTIONS = tuple(PRESETS)

# presets of some ops only (not among CONVENTIONS, which cover every op): torch_scatter's CPU max
# (PyTorch Geometric's; kinds/segment.py's FRAMEWORK_RULES["pyg"] says how its segments start)
_PYG_NOTE = (
    "torch_scatter's CPU {form}: the running {ext} starts at the dtype's {start} and an element "
    "takes over only where it is strictly {cmp} (reducer.h): the first of tied elements wins, a NaN "
    "never does, nor {never}; {unbeaten}; backward scatters grad_out to the winner")
_PYG_FORMS = {
    "segment": ("scatter_max(src, segment_ids, 0, dim_size=num_segments)",
                "a segment no element takes over (empty, or only NaN and {never}) is 0 with no gradient"),
    "csr": ("segment_max_csr(src, indptr)",
            "an empty segment is 0 with no gradient, a non-empty one no element takes over keeps the "
            "{start} (not reproduced: torch_scatter sends its gradient to the previous segment's winner, "
            "its args not reset per segment; symgrad sends none); float32 and float64 (float16's start "
            "is float's lowest there)")}


def _pyg(op: str) -> Preset:
    ext = "min" if "_min" in op else "max"
    words = {"ext": ext, "start": "lowest finite value" if ext == "max" else "largest finite value",
             "cmp": "greater" if ext == "max" else "less",
             "never": "-inf or the lowest value" if ext == "max" else "+inf or the largest value"}
    form, unbeaten = _PYG_FORMS["csr" if op.endswith("_csr") else "segment"]
    words["unbeaten"] = unbeaten.format(**words)
    return Preset("first", "keep", zeros="first", note=_PYG_NOTE.format(form=form.replace("max", ext), **words))


PYG = {op: _pyg(op) for op in ("segment_max", "segment_min", "segment_max_csr", "segment_min_csr")}
PRESETS["pyg"] = PYG


def check_convention(convention: object) -> str | None:
    if convention is None:
        return None
    if not isinstance(convention, str):
        raise TypeError(f"convention must be one of {', '.join(PRESETS)} (a string) or None, "
                        f"got {convention!r}")
    if convention not in PRESETS:
        raise ValueError(f"unknown convention {convention!r}; expected one of: "
                         f"{', '.join(PRESETS)}")
    return convention


def preset_for(convention: object, op: str, params: dict | None = None) -> Preset | None:
    """The preset of an op under a convention (None: none); ``params`` as given: an op called
    without dim may have a preset of its own (Preset.whole)."""
    convention = check_convention(convention)
    if convention is None:
        return None
    preset = PRESETS[convention].get(op)
    if preset is None and op in WITHOUT_PRESET.get(convention, {}):
        covering = " or ".join(f"convention={c!r}" for c in PRESETS if op in PRESETS[c])
        raise ValueError(f"{op} has no {convention} preset ({WITHOUT_PRESET[convention][op]}): expected "
                         f"{covering + ', or ' if covering else ''}ties= and nan=")
    if preset is None:
        raise ValueError(f"convention {convention!r} covers {', '.join(PRESETS[convention])} only, "
                         f"not {op}")
    if preset.whole is not None and (params or {}).get("dim") is None:
        return dataclasses.replace(preset.whole, note=preset.note, order_form=preset.order_form)
    return preset


# ----------------------------------------------------------------------------- issue 30: activations
TORCH.update({
    "rrelu": dataclasses.replace(TORCH["leaky_relu"], note=(
        "F.rrelu(training=False) is leaky_relu(x, (lower + upper) / 2) (the slope in double). "
        + TORCH["leaky_relu"].note)),
    "softshrink": Preset("first", "last_nan", gradient="nested", half="float", zeros="first", note=(
        "F.softshrink: x > lambd ? x - lambd : (x < -lambd ? x + lambd : 0); backward (x >= -lambd "
        "&& x <= lambd) ? 0 : g: 0 at both kinks, g at NaN; written min(max(0, x - lambd), "
        "x + lambd), first, a NaN taking over. PyTorch's CPU kernel contradicts itself: on NaN its "
        "SIMD lanes give 0 and the scalar tail g (this preset follows the scalar code path, as "
        "torch._decomp's softshrink_backward does), and its scalar path's zero band is x * 0 in "
        "every dtype (-0 where -lambd <= x <= -0: one-element and strided tensors, the last "
        "n mod L elements of a contiguous one) where its SIMD lanes give +0, as the preset does "
        "(its max/min form has no piece x * 0), and while its forward "
        "compares with lambd in float32 (the preset too), its backward compares with lambd "
        "rounded to the dtype (0 where |x| is that rounding of a lambd it does not hold)")),
})
JAX.update({
    "rrelu": dataclasses.replace(JAX["leaky_relu"], note=(
        "JAX has no rrelu; this is jax.nn.leaky_relu(x, (lower + upper) / 2). " + JAX["leaky_relu"].note)),
    "softshrink": Preset("first", "keep", zeros="first", note=(
        "JAX has no softshrink; this is where(x > lambd, x - lambd, where(x < -lambd, x + lambd, 0)) "
        "(as one writes it in JAX): 0 at both kinks and at NaN, +0 in the zero band. Its forward "
        "gives 0 at NaN where the preset keeps NaN (every symgrad forward does)")),
})


# ----------------------------------------------------------------------------- order statistics

ORDER_FORMS = {
    "": "as the policy says: a split gives each of the t tied elements 1/t of every tied output's "
        "gradient, and either direction ranks ties by the policy",
    "tree": "as JAX differentiates lax.cummax/cummin: through jax.lax.associative_scan's tree of "
            "binary max/min, each of which sends 1/2 to each of two equal operands (_balanced_eq), "
            "so a tie's elements get powers of 1/2 by their places in the tree",
    "reversed": "descending is the ascending order reversed (jnp.sort(descending=True) is "
                "lax.rev of the stable ascending sort): equal elements rank last-index first there",
    "negated": "the smallest are the largest of -x, negated (-lax.top_k(-x, k): lax.top_k has no "
               "`largest`): so is the gradient, -(0 - g) at the selected elements and -0 elsewhere",
}

_CUM_TORCH = Preset("last", "dominate", grad_start="+0", note=(
    "torch.cummax/cummin (CPU): the running winner is replaced by an element >= it (or NaN), so a "
    "tie goes to the latest tied index and the latest NaN; backward scatter_add of grad_output into "
    "zeros at the indices, in output order in the dtype"))
_SORT_TORCH = Preset("first", "largest", grad_start="written", note=(
    "torch.sort (CPU): a stable sort whatever `stable` says (CUDA's unstable sort may order ties "
    "otherwise), NaN largest, +0 and -0 equal; backward writes grad_output at the indices into "
    "zeros (zeros.scatter)"))
_TOPK_TORCH = Preset("first", "largest", grad_start="written", note=(
    "torch.topk (CPU) selects with std::partial_sort (k * 64 <= n) or std::nth_element and "
    "std::sort, which order equal elements by the algorithm's steps, not by index: values match "
    "bit for bit, the indices and gradient of tied elements may not (this preset ranks ties "
    "first, as a stable sort; CUDA's radix select differs again); backward writes grad_output at "
    "the indices into zeros"))
TORCH.update({"sort": _SORT_TORCH, "topk": _TOPK_TORCH, "cummax": _CUM_TORCH, "cummin": _CUM_TORCH})

_CUM_JAX = Preset("split", "zero", order_form="tree", note=(
    "lax.cummax/cummin: forward XLA's reduce_window max/min (-0 below +0, NaN propagates); the "
    "gradient, on every device, that of jax.lax.associative_scan (the jvp rule differentiates "
    "it): a tree of binary max/min with _balanced_eq's 1/2 to each of two equal operands and 0 to "
    "both where the result is NaN, so torch.cummin([1, 0, 0, 2, 0]) gets [1, 2.25, 1.25, 0, 0.5]; "
    "cotangents are added into +0"))
JAX.update({
    "sort": Preset("first", "largest", order_form="reversed", note=(
        "jnp.sort: a stable sort, NaN largest (every NaN equal), +0 and -0 equal; descending=True "
        "reverses the ascending sort, so its ties come last-index first (jnp.argsort("
        "descending=True) orders them first-index first instead: this preset's indices follow "
        "jnp.sort's values); backward adds grad_output into +0 at the indices (a -0 becomes +0)")),
    "topk": Preset("first", "largest", zeros="ordered", order_form="negated", note=(
        "lax.top_k (largest=False: -lax.top_k(-x, k)): XLA's total order, -0 below +0 and NaN "
        "above +inf (a NaN with its sign bit set, which this preset reads as NaN, ranks below "
        "-inf there), ties first; backward adds grad_output into +0 at the indices")),
    "cummax": _CUM_JAX, "cummin": _CUM_JAX})

# ----------------------------------------------------------------------------- kthvalue, median (issue 29, part 2)
ORDER_FORMS["midpoint"] = (
    "an even count's median is the mean of the two middle elements, (y_low + y_high) * 0.5 in the "
    "dtype (jnp.quantile's method='midpoint'), its gradient g * 0.5 added into +0 at each; it "
    "defines the value, so it stays when ties= overrides the preset's policy")
_MEDIAN_NOTE = (
    "torch.median{nan}(x, dim) (CPU): the index of rank (n - 1) // 2{numbers} in a stable order "
    "(std::nth_element compares (value, index)){nan_rule}; backward writes grad_output at that index "
    "into zeros (value_selecting_reduction_backward). torch.median{nan}(x) without dim: the same "
    "value (std::nth_element over the values alone: of tied +0 and -0 it may return the other), "
    "and backward splits grad_output evenly, grad / count in the dtype, among the elements "
    "equal to it (evenly_distribute_backward: -0 stays -0){whole_nan}, but its forward-mode jvp "
    "(evenly_read_jvp) is not reproduced: it gives NaN where the median is NaN and can differ in the "
    "last bits elsewhere (symgrad's split jvp is the block's mean in float64, rounded once); this "
    "preset is 'first' with "
    "dim and 'split' without. On CUDA the tied index may differ (pytorch/pytorch#161841)")
TORCH.update({
    "kthvalue": Preset("first", "largest", grad_start="written", note=(
        "torch.kthvalue (CPU): quickselect (quick_select_template) over (value, index) pairs, NaN "
        "the largest: the value of rank k - 1 (bit for bit but for which of tied +0 and -0), but "
        "which of equal elements it returns "
        "is the algorithm's, not the index order (this preset ranks ties first, as a stable sort: "
        "the index and the gradient of tied elements may differ, their block's total gradient "
        "does not; CUDA's radix select differs again); backward writes grad_output at the index "
        "into zeros")),
    "median": Preset("first", "dominate", grad_start="written", note=_MEDIAN_NOTE.format(
        nan="", numbers="", nan_rule=", or, where the row holds NaN, its first NaN",
        whole_nan=" (the NaNs where the median is NaN)"),
        whole=Preset("split", "dominate", grad_start="written")),
    "nanmedian": Preset("first", "omit", grad_start="written", note=_MEDIAN_NOTE.format(
        nan="nanmedian", numbers=" of the row's n numbers (NaNs left out)", nan_rule=(
            "; a row of NaNs only gives NaN at an index std::nth_element leaves there, its "
            "comparator not being an order on NaNs: which NaN is the algorithm's"),
        whole_nan=" (every NaN where all are NaN)"),
        whole=Preset("split", "omit", grad_start="written")),
})
_JAX_MEDIAN_NOTE = (
    "jnp.{name}: jnp.quantile(x, 0.5, method='midpoint'): a stable lax.sort (NaN the largest, +0 "
    "and -0 equal; ties first), then (sorted[low] + sorted[high]) * 0.5 in the dtype, low = "
    "(c - 1) // 2 and high = c // 2 of the row's c {count}{nan}; the gradient g * 0.5 added into "
    "+0 at each of the two elements. bfloat16 here computes the sum in float32, so two values "
    "whose sum overflows bfloat16 but not float32 (above 3.39e38) give a finite median where JAX "
    "gives inf; JAX has no index")
JAX.update({
    "kthvalue": Preset("first", "largest", note=(
        "JAX has no kthvalue; this is jnp.sort(x, axis=dim)[..., k - 1] (stable, NaN the largest, "
        "ties first), its gradient added into +0 at the element")),
    "median": Preset("first", "propagate", order_form="midpoint", note=_JAX_MEDIAN_NOTE.format(
        name="median", count="elements", nan=" (a row holding NaN is filled with NaN first: output "
        "NaN, no gradient)")),
    "nanmedian": Preset("first", "omit_zero", order_form="midpoint", note=_JAX_MEDIAN_NOTE.format(
        name="nanmedian", count="numbers (the NaNs sort last)", nan=" (a row of NaNs only: NaN, no "
        "gradient)")),
})


# ----------------------------------------------------------------------------- issue 30: losses
TORCH.update({
    "l1_loss": dataclasses.replace(TORCH["abs"], broadcast_sum="torch", note=(
        "F.l1_loss: (input - target).abs(), its gradient g * sgn(input - target) (0 at a tie and "
        "at NaN), the target's its negation; forward fabs (+0 at -0)")),
    "margin_ranking_loss": Preset("last", "keep", gradient="scaled", zeros="first", broadcast_sum="torch", note=(
        "F.margin_ranking_loss: (-target * (input1 - input2) + margin).clamp_min_(0), its "
        "gradient where(v >= 0, g, 0) times each input's coefficient: g passes at the kink, 0 "
        "at NaN; written max(0, v), last; forward +0 where v is 0 (v + margin adds +0)")),
})
JAX.update({
    "l1_loss": dataclasses.replace(JAX["abs"], note=(
        "jnp.abs(input - target) (optax has no l1 loss): " + JAX["abs"].note)),
    "margin_ranking_loss": dataclasses.replace(JAX["maximum"], gradient="chained", note=(
        "JAX has no margin ranking loss; this is jnp.maximum(0, margin - target * (input1 - "
        "input2)) (as one writes it in JAX): 1/2 at the kink, 0 at NaN; forward XLA max")),
})


# ----------------------------------------------------------------------------- NaN-aware reductions
# nanmax/nanmin (issue 30): PyTorch has no nanmax; its preset is the code a PyTorch user writes
_NANRED_TORCH = (
    "PyTorch has no nanmax/nanmin; this is torch.where(x.isnan(), -inf, x).amax(dim, keepdim) (+inf "
    "and amin for nanmin; x.nan_to_num(-inf) would also turn +inf into the largest float), with "
    "NaN put back where x.isnan().all(dim, keepdim) (torch.where): amax's (g / count) * mask, the "
    "NaNs +0 (the where's backward), a slice whose max is -inf counting its NaNs among the tied "
    "(each -inf gets g / count), a slice of NaNs 0; jvp where(mask, t, 0) summed (at::sum) / count; "
    "forward: of +0 and -0 the first (amax's scalar fold)")
TORCH.update({
    "nanmax": Preset("split", "fill", zeros="first", tangent_sum="torch", note=_NANRED_TORCH),
    "nanmin": Preset("split", "fill", zeros="first", tangent_sum="torch", note="as nanmax: " + _NANRED_TORCH),
})
JAX.update({
    "nanmax": Preset("split", "fill", zeros="ordered", note=(
        "jnp.nanmax: jnp.max(where(isnan(x), -inf, x)), NaN where the slice is all NaN: "
        "(g / count) * eq(x, ans), the NaNs +0 (the where's VJP), a slice whose max is -inf "
        "counting its NaNs among the tied, a slice of NaNs 0; forward XLA max (-0 below +0)")),
    "nanmin": Preset("split", "fill", zeros="ordered", note="jnp.nanmin: as jnp.nanmax (+inf for NaN)"),
})


# ----------------------------------------------------------------------------- issue 30: hard activations
TORCH.update({
    "hardsigmoid": Preset("first", "keep", gradient="nested", half="float", zeros="first", note=(
        "F.hardsigmoid: min(max(x + 3, 0), 6) / 6; backward (x > -3 && x < 3) ? g * (1/6 as a "
        "float, in float64 too) : 0: 0 at both kinks and at NaN; written (min(3, max(-3, x)) + 3) "
        "/ 6, first (the same value: x + 3 rounds alike where the clamp lets x through)")),
    "threshold": Preset("first", "dominate", gradient="nested", half="float", zeros="first", note=(
        "F.threshold: x <= threshold ? value : x; backward x <= threshold ? 0 : g: value and 0 at "
        "the threshold, x (NaN) and g at NaN")),
})
JAX.update({
    "hardsigmoid": Preset("first", "keep", gradient="nested", zeros="ordered", note=(
        "jax.nn.hard_sigmoid: relu6(x + 3) / 6, which XLA computes as * (1/6) (1/6 rounded to the "
        "dtype); relu6's custom_jvp (x + 3 > 0) & (x + 3 < 6): 0 at both kinks and at NaN, compared "
        "through x + 3 (at x just below 3, where x + 3 rounds to 6, 0 where PyTorch gives g/6). "
        "bfloat16: XLA multiplies by 1/6 in float32 and rounds once, the preset by 1/6 rounded to "
        "bfloat16 (one bfloat16 ulp apart at some inputs)")),
    "threshold": Preset("first", "keep", gradient="nested", zeros="first", note=(
        "JAX has no threshold; this is where(x > threshold, x, value) (as one writes it in JAX): "
        "value and 0 at the threshold and at NaN")),
})


# ----------------------------------------------------------------------------- issue 30: hardshrink
TORCH["hardshrink"] = Preset("first", "dominate", gradient="nested", half="float", zeros="first", note=(
    "F.hardshrink: (x >= -lambd && x <= lambd) ? 0 : x; backward (x >= -lambd && x <= lambd) ? 0 : "
    "g: 0 at both kinks, x (NaN) and g at NaN (its SIMD lanes give 0 there, the scalar path g: the "
    "preset follows the scalar path). In float16 and bfloat16 it compares with lambd rounded to "
    "the dtype, the preset in float32 (0 where |x| is that rounding of a lambd it does not hold)"))
JAX["hardshrink"] = Preset("first", "keep", gradient="nested", zeros="first", note=(
    "JAX has no hardshrink; this is where(abs(x) > lambd, x, 0) (as one writes it in JAX): 0 at "
    "both kinks, 0 and 0 at NaN"))


# ----------------------------------------------------------------------------- issue 30: hardswish
TORCH["hardswish"] = Preset("first", "keep", gradient="nested", half="float", zeros="first", note=(
    "F.hardswish: x * min(max(x + 3, 0), 6) / 6; backward x <= -3 ? 0 : x < 3 ? g * (x / 3 + 0.5) : "
    "g (float16/bfloat16 in float32): 0 at -3, g at 3, NaN and g at NaN (its scalar path; its SIMD "
    "lanes give NaN: the preset follows the scalar path)"))
JAX["hardswish"] = Preset("first", "keep", gradient="nested", zeros="ordered", note=(
    "jax.nn.hard_swish: x * hard_sigmoid(x), hard_sigmoid = relu6(x + 3) * (1/6) (XLA's / 6); "
    "autodiff g * hs + ((0 < x + 3 < 6) ? (x * g) * (1/6) : 0): 0 at -3, g * (6 * (1/6)) at 3, NaN "
    "at NaN. float32/float64: XLA computes g * hs + ... as one fused multiply-add, the preset "
    "rounds g * hs first (they differ by at most half an ulp of g * hs and one of the result). "
    "bfloat16: XLA multiplies by 1/6 held in float32, the preset by 1/6 rounded to bfloat16 (within "
    "2 bfloat16 ulps of the output, 4 of the gradient's larger term)"))


# ----------------------------------------------------------------------------- issue 30: elu, celu
_ELU_TORCH = ("aten's elu kernel: x <= 0 ? expm1(x * s) * alpha : x; backward x <= 0 ? g * s * "
              "alpha * exp(x * s) : g, s = 1 (elu) or 1/alpha held in the dtype (celu): alpha at 0 "
              "(1 for celu), x and g at NaN (its SIMD lanes give NaN there: the preset follows the scalar "
              "path); float16/bfloat16 in float32. Its exp/expm1 are libm's "
              "(scalar path) or SLEEF's (SIMD lanes), the preset's NumPy's: the smooth piece agrees "
              "to a few ulps, not bit for bit (tests/test_elu30.py states the bound)")
TORCH["elu"] = Preset("first", "dominate", gradient="nested", half="float", zeros="first", note=_ELU_TORCH)
TORCH["celu"] = Preset("first", "dominate", gradient="nested", half="float", zeros="first", note=_ELU_TORCH)
JAX["elu"] = Preset("first", "keep", gradient="sum", zeros="first", note=(
    "jax.nn.elu: where(x > 0, x, alpha * expm1(where(x > 0, 0, x))); autodiff (alpha * g) * "
    "(expm1(x) + 1) where x <= 0 and at NaN, g + 0 above (+0 for g = -0): alpha at 0, NaN at NaN. "
    "XLA's expm1 is not NumPy's: the smooth piece agrees to a few ulps (tests/test_elu30.py)"))
JAX["celu"] = Preset("first", "keep", gradient="nested", zeros="first", note=(
    "jax.nn.celu: max(x, 0) + alpha * expm1(min(x, 0) / alpha), two nodes summed; the preset is "
    "jax.nn.elu's where() form with expm1(x / alpha) (1 at 0 as JAX's half-and-half ties give, NaN at "
    "NaN; one term, no + 0, as JAX's sum of a term and a zero term). Where they differ: the output +0 "
    "at x = -0 (the preset -0), the gradient NaN where x != 0 and g = +-inf (g times the other "
    "node's weight 0; the preset g * dy/dx), and XLA's "
    "expm1 on the smooth piece (tests/test_elu30.py states the ulps)"))
# bags (issue 33): embedding_bag_max as at::_embedding_bag's CPU max path
TORCH["embedding_bag_max"] = Preset("first", "keep", zeros="first", note=(
    "F.embedding_bag(mode='max') on the CPU: per bag and column, the first row is taken and a "
    "later row takes over where it is strictly greater (weight_item > current_item): the first "
    "of equals wins (+0 and -0 too), a NaN never takes over and a NaN that comes first keeps the "
    "bag, whose output is the winner's value (a NaN later in the bag is ignored); an empty bag (or "
    "one of padding_idx only) is 0 with no gradient; backward index_add_s each bag's gradient onto "
    "its winner's table row, in bag order"))
JAX["embedding_bag_max"] = Preset("split", "zero", zeros="ordered", note=(
    "JAX has no embedding_bag; this is jax.ops.segment_max(weight[input], bag ids, num_segments) "
    "(padding_idx's rows left out) with an empty bag's -inf set to 0, as one writes it in JAX: "
    "-0 below +0, each hit gets g * (1 / count), count the hits plus 1 where the bag's max is -inf "
    "(the fill), a bag holding NaN no gradient; the rows' gradients added onto the table in index "
    "order (JAX's gather transpose, a scatter-add, may add them in another order)"))
# the ops a framework has no counterpart of, so no preset (why, in words)
WITHOUT_PRESET = {"jax": {"roi_max_pool": "JAX has no roi_pool"}}
TORCH["roi_max_pool"] = Preset("first", "keep", zeros="first", note=(
    "torchvision.ops.roi_pool on the CPU (roi_pool_kernel.cpp): box corners scaled and rounded in "
    "the input's dtype, each bin's running max starts at -FLT_MAX with no winner and an element "
    "takes over where it is strictly greater, so the first of equals (+0 and -0 too) wins, a NaN "
    "never wins and a bin of NaN, -inf or values at or below -FLT_MAX has output -FLT_MAX and no "
    "gradient; an empty bin is 0; backward adds each bin's gradient onto its winner in box, "
    "channel, bin order"))
# JAX's binary max/min: a broadcast input's gradient summed as XLA sums it (BROADCAST_SUMS "jax")
for _name in ("maximum", "minimum", "fmax", "fmin"):
    JAX[_name] = dataclasses.replace(JAX[_name], broadcast_sum="jax")


# logsumexp's float16/bfloat16 arithmetic under a preset (issue 28; lower.LogSumExpKernel.half):
# PyTorch and XLA compute each op (x - m, exp, the sum in float32, log, + m; backward PyTorch's
# x - y, exp, product, JAX's g / sum times exp(x - m)) in float32 and store it in the dtype, their
# exp and log then agreeing with the correctly rounded float32 result on every float16/bfloat16
# value (XLA's with subnormals flushed; tools/framework_exp_log.py, tests/test_lse_half.py).
# float32/float64 keep NumPy's exp and log: PyTorch's are Intel MKL VML's, XLA's its own
# polynomials (docs/guarantees.md).
LSE_HALF = {"torch": "torch", "jax": "jax"}
