"""flyreg-scale: two CPU kernels with a tunable knob, registered as flyreg ops by entry points."""

__version__ = "0.3.0"
