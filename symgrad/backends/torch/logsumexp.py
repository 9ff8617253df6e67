"""The torch backend's logsumexp (``lower.LogSumExpKernel``): the template context of
``logsumexp.py.jinja``, the kernel's expressions printed in torch operations, its inexact numbers
(1 / the temperature's divisor) named and rounded to each working dtype as NumPy rounds them."""

from __future__ import annotations

from .printer import float_literal, rounded, torch_code


def logsumexp_context(op, kernel) -> dict:
    """The strings logsumexp.py.jinja places: the kernel's expressions and named numbers."""
    numbers: list = []
    code = {name: torch_code(getattr(kernel, name), numbers) for name in ("shift", "term", "output", "weight")}
    t = op.params["temperature"]
    return {"params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "reduced_length": "math.prod([shape[i] for i in dims])", "empty_slices": True,
            "numbers": {dtype: [float_literal(rounded(v, dtype)) for v in numbers] for dtype in ("float32", "float64")},
            "unpack_lines": [f"({', '.join(f'_n{k}' for k in range(len(numbers)))},) = _NUMBERS[v.dtype]"]
            if numbers else [],
            "formula": f"{t!r} * log(sum(exp(x / {t!r})))" if t != 1 else "log(sum(exp(x)))",
            "weight_text": f"exp((x - y) / {t!r})" if t != 1 else "exp(x - y)", **code, **half_context(kernel)}


def half_context(kernel) -> dict:
    """The float16/bfloat16 branches where the kernel's half names a framework (conventions.LSE_HALF):
    each of its ops rounded to the dtype as it rounds them, in torch operations
    (templates/_lse_half_torch.py.jinja, _lse_half_jax.py.jinja); none where it is "float32"."""
    if kernel.half == "float32":
        return {"lse_half_partial": "", "half_forward": [], "half_backward": [], "half_jvp": []}
    each = f"{HALF_WORDS[kernel.half]}'s ops one by one, each rounded to the dtype (conventions.LSE_HALF)"
    return {"lse_half_partial": f"torch/_lse_half_{kernel.half}.py.jinja",
            "half_forward": [f"if x.dtype in _HALVES:  # {each}", "    output = _half_forward(x, dims, n, out_shape)",
                             "    return output, Saved(x, output, tuple(x.shape), out_shape, x.dtype)"],
            "half_backward": [f"if saved.dtype in _HALVES:  # {each}",
                              "    return (_half_backward(grad_output, saved, dims, n),)"],
            "half_jvp": ["if saved.dtype in _HALVES:  # backward's transpose, op by op, rounded as backward rounds",
                         "    return _half_jvp(tangent, saved, dims, n)"]}


# whose arithmetic a preset's float16/bfloat16 logsumexp reproduces (lower.LogSumExpKernel.half)
HALF_WORDS = {"torch": "torch.logsumexp", "jax": "jax.nn.logsumexp"}
