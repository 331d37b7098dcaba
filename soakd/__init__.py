"""soakd: a soak-test daemon for PyTorch inference."""

__version__ = "0.1.0"
