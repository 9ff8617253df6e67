"""What the C ("cpu") and CUDA backends share, one level below both (backends/README.md's layer
below the backends): the C99 printer both printers derive from (``printer.py``), the C identifiers
made of an input's name and the macros those may not be (``naming.py``, ``macros.py``), and the
template pieces both sources include as ``cfamily/...`` (``templates/``), the order statistics'
strings (``order.py``); here the finished strings both backends' contexts compute the same way."""


def padding_strings(kernel) -> dict:
    """A pooling window's padding in C, from the lowered kernel: whether it takes part (as -inf,
    for max; +inf for min), the words on it and its value."""
    return {"padding_takes_part": "true" if kernel.padding_takes_part else "false",
            "padding_comment": ("padding takes part, as -inf (a gradient it wins is dropped)"
                                if kernel.padding_takes_part else "padding never wins"),
            "padding_value": "-sg_inf_f()" if kernel.selection.extremum == "max" else "sg_inf_f()"}
