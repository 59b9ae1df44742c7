"""`make demo`: the whole flow on an embedded simulated node, no cluster needed."""

# What the simulator and the demo need beyond the product (pyproject's `sim` extra): the image and
# a plain `pip install gpuslice` leave them out, and a missing one is named with its remedy here
# rather than as a bare ImportError from deep inside.
try:
    import cryptography  # noqa: F401
    import jsonpatch  # noqa: F401
except ImportError as _missing:
    raise ImportError(
        f"gpuslice-demo needs the simulator's extra, which this install lacks ({_missing.name}): "
        "pip install 'gpuslice[sim]'"
    ) from _missing
