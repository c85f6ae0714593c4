"""Decoder tests (a package, so that its conftest and modules do not shadow the top-level ones)."""
