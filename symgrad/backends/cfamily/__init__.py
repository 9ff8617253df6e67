"""What the C ("cpu") and CUDA backends share, one level below both (backends/README.md's layer
below the backends): the C99 printer both printers derive from (``printer.py``), the C identifiers
made of an input's name and the macros those may not be (``naming.py``, ``macros.py``), and the
template pieces both sources include as ``cfamily/...`` (``templates/``)."""
