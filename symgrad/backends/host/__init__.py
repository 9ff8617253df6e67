"""The host layer: the Python side that every backend emits (the NumPy backend's module itself, the
cpu backend's ctypes loader, the CUDA backend's CuPy loader).  ``printer.py`` is the host language's
printer (NumPy); ``templates/`` holds the Python pieces the backends' templates include as
``host/<file>``."""
