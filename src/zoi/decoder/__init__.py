"""Decoders (issue 14): see api.py for the contract between the runtime, the kernels and the scheduler."""
