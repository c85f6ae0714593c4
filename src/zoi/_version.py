"""The package version (a module of its own: the layers below the API read it too)."""

__version__ = "0.1.0"
