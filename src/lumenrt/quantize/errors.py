"""The one error ``lumenrt quantize`` answers with exit status 2."""


class UsageError(ValueError):
    """A bad argument or input file; the message names it (``--calibration calib: ...``) and is
    printed as one line."""
