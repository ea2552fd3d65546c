"""Build glue for the native kernels; all metadata lives in pyproject.toml."""

from setuptools import setup

setup()
