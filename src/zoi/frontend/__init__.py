"""Frontend: Hugging Face folder -> ModelSpec, canonical weights, tokenizer."""

from zoi.frontend.checkpoint import load_checkpoint, load_spec
from zoi.frontend.spec import ModelSpec
from zoi.frontend.tokenizer import Tokenizer, pack

__all__ = ["ModelSpec", "Tokenizer", "load_checkpoint", "load_spec", "pack"]
