"""FastSwap Cam: live face swap on a webcam feed, published as a virtual camera."""

__version__ = "0.1.0"
