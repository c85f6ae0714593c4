"""Every error zoi raises on bad input derives from ZoiError and names the problem and the fix."""

from __future__ import annotations


class ZoiError(Exception):
    """Base class of zoi's errors."""


class CheckpointError(ZoiError):
    """A model folder or artifact is missing, corrupt or unsupported."""


class UnsupportedModelError(CheckpointError):
    """The architecture or an option of the checkpoint is not supported."""


class InputError(ZoiError, ValueError):
    """Bad input to encode (too long, too many, wrong shape)."""


class BackendUnavailableError(ZoiError):
    """The requested device/backend cannot run here (no GPU, no triton, no native core)."""


class NumericalError(ZoiError):
    """The model produced non-finite values (NaN/Inf): the weights or the config, not the input."""


class HeadError(InputError):
    """The call needs a task head the loaded model does not have: e.g. rerank on
    an embedding model. The message names the model's head."""
