"""The CUDA backend's logsumexp in float16/bfloat16 under a preset (``lower.LogSumExpKernel.half``
"torch" or "jax", conventions.LSE_HALF): the template context of the kernels that round each of
the framework's ops to the dtype as it rounds them (templates/_lse_half_<half>.cu.jinja) and of
the loader's branches that launch them (templates/_loader_lse_half.py.jinja), the NumPy module's
rule (host/_lse_half_<half>.py.jinja) bit for bit.

The framework's float32 sum (at::sum's order, XLA's reduce order) is written out by the loader as
a program, the postfix order of its additions, made by running the NumPy module's model of that
sum on symbols instead of numbers; the kernels run it on each row.  SUM_ZERO, SUM_ADD and SUM_END
are its opcodes (a term's index is >= 0), SUM_STACK the depth of the kernels' stack."""

from __future__ import annotations

# the sum programs' opcodes and the kernels' stack depth (the .cu and the loader place the same)
SUM_ZERO, SUM_ADD, SUM_END = -1, -2, -3
SUM_STACK = 64

# whose arithmetic a preset's float16/bfloat16 logsumexp reproduces
HALF_WORDS = {"torch": "torch.logsumexp", "jax": "jax.nn.logsumexp"}
HALF_DTYPES = (("f16", "sg_half"), ("bf16", "sg_bfloat16"))
# the model of the framework's sum the loader runs on symbols (its host partial, and its function)
SUM_MODELS = {"torch": ("host/_torch_sum.py.jinja", "_torch_programs"),
              "jax": ("host/_xla_sum_to.py.jinja", "_xla_programs")}
# the half kernels' arguments after the rows of x: torch's backward is a thread per element and
# needs no sum; jax's is a thread per row (none for empty rows, which have no gradient to write)
# and adds the row's terms again
_BACKWARD = {"torch": ("rows * n", "saved.output, "),
             "jax": ("rows if n else 0", "*_order(cp, saved.input_shape, dims, n), ")}
_JVP = {"torch": "saved.output, ", "jax": ""}
# jvp's branch: its launch (indented), and what it does with empty slices (torch: the sum of no
# terms, the +0 jvp starts from; jax: 0 / |0|)
_JVP_BRANCH = {"torch": ("if saved.dtype.name in _HALVES and n:", "    ", []),
               "jax": ("if saved.dtype.name in _HALVES:", "        ",
                       ["    else:  # jax.jvp of an empty slice: 0 / |sum|, the sum 0", "        out[...] = np.nan"])}


def half_context(kernel) -> dict:
    """The partials and finished lines of the float16/bfloat16 kernels and the loader's branches
    where the kernel's half names a framework; empty where it is "float32"."""
    if kernel.half == "float32":
        return {"lse_half_cu": "", "lse_half_loader": "", "half_forward": [], "half_backward": [],
                "half_jvp": []}
    each = f"{HALF_WORDS[kernel.half]}'s ops one by one, each rounded to the dtype (conventions.LSE_HALF)"
    threads, backward_reads = _BACKWARD[kernel.half]
    model, programs = SUM_MODELS[kernel.half]
    test, indent, empty = _JVP_BRANCH[kernel.half]
    return {
        "lse_half_cu": f"cuda/_lse_half_{kernel.half}.cu.jinja",
        "lse_half_loader": "cuda/_loader_lse_half.py.jinja",
        "sum_model": model, "sum_programs": programs,
        "half_framework": HALF_WORDS[kernel.half],
        "half_dtypes": [{"name": n, "ctype": c} for n, c in HALF_DTYPES],
        "sum_zero": str(SUM_ZERO), "sum_add": str(SUM_ADD), "sum_end": str(SUM_END), "sum_stack": str(SUM_STACK),
        "half_forward": [
            f"elif x.dtype.name in _HALVES:  # {each}",
            "    _launch(cp, f\"forward_half_{_DTYPES[x.dtype.name]}\", rows,",
            "            (xr, *_order(cp, shape, dims, n), output, np.int64(rows), np.int64(n)))"],
        "half_backward": [
            f"if saved.dtype.name in _HALVES:  # {each}",
            f"    _launch(cp, f\"backward_half_{{_DTYPES[saved.dtype.name]}}\", {threads},",
            f"            (go, saved.x, {backward_reads}grad_rows, np.int64(rows), np.int64(n)))",
            "    return (_unrows(cp, grad_rows, saved.input_shape, dims),)"],
        "half_jvp": [
            f"{test}  # backward's transpose, op by op, rounded as backward rounds",
            *(["    if n:"] if empty else []),
            f"{indent}_launch(cp, f\"jvp_half_{{_DTYPES[saved.dtype.name]}}\", rows,",
            f"{indent}        (tr, saved.x, {_JVP[kernel.half]}*_order(cp, saved.input_shape, dims, n), out, np.int64(rows), np.int64(n)))",
            *empty,
            "    return out.reshape(saved.output_shape)"],
    }
