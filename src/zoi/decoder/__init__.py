"""Decoders: see api.py for the contract between the runtime, the kernels and the scheduler."""
