"""Option values that name the wrong thing or silently become something else: a decoder's sized
options (max_seq_len, max_batch, kv_blocks, block_size, max_tokens) given as 0 or a negative
number are refused naming the option and the allowed range, before the folder is read, instead
of falling back to the default (max_seq_len=0 used to serve with the default context) or
failing on a derived value (max_seq_len=-5 used to say "num_blocks must be a positive
integer")."""

from __future__ import annotations

import pytest

import zoi
from zoi.errors import InputError

pytest.importorskip("zoi._cpu")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from tests.decoder.dec_helpers import decoder_checkpoint

    return decoder_checkpoint(tmp_path_factory, "llama_gqa")


@pytest.mark.parametrize(
    "option, value, flag",
    [
        ("max_seq_len", 0, "--max-seq-len"),
        ("max_seq_len", -5, "--max-seq-len"),
        ("max_batch", 0, "--max-running-requests"),
        ("kv_blocks", 0, "--kv-blocks"),
        ("block_size", 0, "--kv-block-size"),
        ("max_tokens", 0, None),
        ("max_seq_len", 1.5, "--max-seq-len"),
        ("max_seq_len", True, "--max-seq-len"),
    ],
)
def test_decoder_size_options_out_of_range_are_named(llama, monkeypatch, option, value, flag):
    from zoi.decoder import compile as dc

    def never(*a, **k):
        raise AssertionError("the folder was read before the options were checked")

    monkeypatch.setattr(dc, "load_decoder", never)
    with pytest.raises(InputError) as e:
        zoi.compile(llama, **{option: value})
    msg = str(e.value)
    assert f"{option}={value!r}" in msg and "must be an integer >= 1" in msg, msg
    assert flag is None or flag in msg, msg


def test_decoder_size_options_none_and_positive_still_compile(llama):
    g = zoi.compile(llama, max_seq_len=None, kv_blocks=16, block_size=8, max_batch=2)
    assert g.backend.max_seq_len == 512  # None: min(2048, the model's max_position_embeddings)
    g = zoi.compile(llama, max_seq_len=64, kv_blocks=16, block_size=8, max_batch=2, max_tokens=32)
    assert g.backend.max_seq_len == 64
    assert g.generate(["kazo"], max_new_tokens=2)[0].finish_reason == "length"
