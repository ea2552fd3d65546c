"""The `edgefleet` command: one entry point that composes the parts' commands."""

__version__ = "0.1.0"
