"""The strings of a segment kernel's (scatter_max, segment_max) host code that differ between an
input tensor as its initial element (scatter) and a fill (segment_max): the NumPy module's and the
cpu loader's (their layout partials host/_segment_scatter and host/_segment_fill)."""

# the strings that differ between an input tensor as the initial element (scatter) and a fill
SEGMENT_INITIAL = {
    "input": {"layout_partial": "host/_segment_scatter.py.jinja", "dim": "_dim(len(saved.output_shape))",
              "returns": "(_placed(grad_initial, saved.output_shape, d), None, _placed(grad_src, saved.src_shape, d))",
              "grads_doc": "grad_input, None, grad_src",
              "initial_tangent": 'np.moveaxis(_as_tangent("tangent_input", tangent_input, saved, '
                                 'saved.output_shape), d, 0)',
              "forward_doc": "the scatter_reduce of src into input along DIM"},
    "fill": {"layout_partial": "host/_segment_fill.py.jinja", "dim": "0",
             "returns": "(_placed(grad_src, saved.src_shape, d), None)",
             "grads_doc": "grad_data, None",
             "initial_tangent": "np.zeros(saved.output_shape, dtype=saved.dtype)",
             "forward_doc": "each segment's extremum of data's rows, FILL where empty"},
}
