"""The order statistics' cases every compiled backend is compared on with the NumPy module
(tests/test_cpu_order.py, tests/test_cuda_order.py): each policy and preset of each op, with the
dims, NaN rules and parameters that take a kernel down another path."""

POLICIES = ("first", "last", "split", "all")


def every_case():
    for ties in POLICIES:
        yield "sort", {"ties": ties}
        yield "sort", {"ties": ties, "descending": True, "dim": 0}
        yield "topk", {"ties": ties, "k": 3}
        yield "topk", {"ties": ties, "k": 40, "largest": False, "dim": 0}
        yield "cummax", {"ties": ties, "dim": 1}
        yield "cummin", {"ties": ties, "dim": 0}
    for ties in ("split", "all"):
        yield "cummax", {"ties": ties, "dim": 1, "nan": "zero"}
    for ties in POLICIES:  # one rank of each row (kinds/median.py)
        yield "kthvalue", {"ties": ties, "k": 2, "dim": 1}
        yield "median", {"ties": ties, "dim": 0}
        yield "median", {"ties": ties, "dim": None, "nan": "propagate"}
        yield "nanmedian", {"ties": ties, "dim": 1, "keepdim": True}
        yield "nanmedian", {"ties": ties, "dim": None, "nan": "omit_zero"}
    yield "nanmedian", {"dim": 0, "ties": "split", "convention": "jax"}  # JAX's two middle ranks, blocks
    for convention in ("torch", "jax"):
        yield "kthvalue", {"k": 3, "dim": 1, "convention": convention}
        for name in ("median", "nanmedian"):
            yield name, {"dim": -1, "convention": convention}
            yield name, {"dim": None, "convention": convention}
            yield name, {"dim": 0, "keepdim": True, "convention": convention}
    yield "cummax", {"dim": -1, "convention": "torch"}  # benchmarks/order.py's
    for convention in ("torch", "jax"):
        for name, params in (("sort", {}), ("sort", {"descending": True}), ("topk", {"k": 2}),
                             ("topk", {"k": 2, "largest": False}), ("cummax", {"dim": 1}), ("cummin", {"dim": 1})):
            yield name, params | {"convention": convention}
