"""Setuptools shim: the project is configured in pyproject.toml."""

from setuptools import setup

setup()
