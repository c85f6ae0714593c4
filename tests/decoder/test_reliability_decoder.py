"""The decoder against hostile options and files: a KV pool or buffers too large for the memory
are refused before they are allocated, naming the option and the bytes; a tokenizer.json's padding
and truncation never reach a prompt; a temperature too small to divide by is greedy (the Python API
and /v1/completions alike); a corrupt config.json is refused naming the field, its value and the
allowed range."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from zoi.decoder import memory
from zoi.decoder.api import GREEDY_TEMPERATURE, SamplingParams
from zoi.decoder.compile import compile_decoder
from zoi.decoder.loader import load_decoder, spec_from_config
from zoi.errors import CheckpointError, InputError

from .dec_helpers import PROMPTS, hf_greedy

pytest.importorskip("zoi._cpu")

N = 12


@pytest.fixture(scope="module")
def llama(ckpt):
    return ckpt("llama_gqa")


@pytest.fixture(scope="module")
def gen(llama):
    return compile_decoder(llama, max_seq_len=128, kv_blocks=64, block_size=8, max_batch=4)


class Live:
    """`zoi serve`'s decoder app over a compiled Generator, on a uvicorn thread (real sockets)."""

    def __init__(self, generator):
        import uvicorn

        from zoi.serve.app import create_app
        from zoi.serve.config import ServeConfig
        from zoi.serve.decoder_service import DecoderService

        self.service = DecoderService.from_generator(generator, ServeConfig(), "m")
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        cfg = uvicorn.Config(create_app(self.service), log_level="warning", lifespan="on")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        t0 = time.time()
        while not self.server.started:
            assert time.time() - t0 < 30 and self.thread.is_alive(), "the server did not start"
            time.sleep(0.01)

    def complete(self, **body) -> dict:
        import httpx

        r = httpx.post(self.url + "/v1/completions", json={"model": "m", **body}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def live():
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    servers = []

    def make(generator):
        servers.append(Live(generator))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


# ---- memory: the pool and buffers the options size ------------------------------------------


def _small_memory(monkeypatch, nbytes: int = 64 << 20) -> None:
    monkeypatch.setattr(memory, "available_host_bytes", lambda: (nbytes, "available"))


def test_a_kv_pool_over_the_memory_is_refused_before_it_is_allocated(llama):
    """1e9 blocks would be terabytes: refused at once with the option and the bytes (the free
    list alone used to grow to tens of GB before the kernel killed the process)."""
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        compile_decoder(llama, kv_blocks=1_000_000_000)
    assert time.perf_counter() - t0 < 30
    msg = str(e.value)
    assert "kv_blocks=1000000000" in msg and "--kv-blocks" in msg
    assert "bytes" in msg and "TiB" in msg and "host memory" in msg, msg
    assert "lower kv_blocks" in msg


@pytest.mark.parametrize(
    "opts, option",
    [
        (dict(kv_blocks=20_000), "kv_blocks"),  # 160 MiB of KV
        (dict(max_tokens=1_000_000), "max_tokens"),  # step activations of 1e6 rows
        (dict(kv_blocks=16, block_size=1, max_seq_len=None), "max_seq_len"),  # RoPE tables
    ],
)
def test_each_sized_option_is_checked_against_the_memory(
    tmp_path, llama, monkeypatch, opts, option
):
    folder = tmp_path / "m"
    shutil.copytree(llama, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 10_000_000
    (folder / "config.json").write_text(json.dumps(cfg))
    if opts.get("max_seq_len", 0) is None:
        opts = {**opts, "max_seq_len": 10_000_000}
    _small_memory(monkeypatch)
    with pytest.raises(InputError, match=f"lower {option}") as e:
        compile_decoder(folder, **{"max_seq_len": 128, **opts})
    assert f"{option}=" in str(e.value) and "more than the 64.0 MiB available" in str(e.value)


def test_what_fits_still_compiles(llama, monkeypatch):
    _small_memory(monkeypatch)
    g = compile_decoder(llama, max_seq_len=64, kv_blocks=64, block_size=8)
    assert g.generate(["kazo"], max_new_tokens=2)[0].finish_reason == "length"


def test_the_cpu_limits_name_the_option(llama):
    with pytest.raises(InputError, match=r"max_batch=2000 \(zoi serve --max-running-requests\)"):
        compile_decoder(llama, max_batch=2000)
    with pytest.raises(InputError, match=r"block_size=512 .*\[1, 256\]"):
        compile_decoder(llama, block_size=512)


def test_zoi_serve_refuses_a_kv_pool_over_the_memory(llama):
    """`zoi serve DECODER --kv-blocks 1000000000` exits with the message, under an address-space
    limit that turns any attempt to allocate the pool into a quick failure instead of an OOM."""

    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    env = {**os.environ, "ZOI_LOG_LEVEL": "warning"}
    p = subprocess.run(
        [sys.executable, "-c", "import sys; from zoi.cli import main; sys.exit(main())"]
        + ["serve", str(llama), "--kv-blocks", "1000000000", "--host", "127.0.0.1", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
        env=env,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "zoi: error:" in p.stderr and "kv_blocks=1000000000" in p.stderr, p.stderr[-2000:]
    assert "--kv-blocks" in p.stderr and "bytes" in p.stderr


# ---- the tokenizer's padding and truncation -------------------------------------------------

WORDS = "kazo mira te lu ne so pi da gro ven shi qua ber zo mi ra".split()


def _padded_folder(dst: Path, pad_to: int = 128, truncate: int | None = None) -> Path:
    """A random-init LlamaForCausalLM (transformers' save_pretrained) beside a WordLevel
    tokenizer.json that pads every encoding to `pad_to` (and truncates at `truncate`)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_padding(length=pad_to, pad_id=0, pad_token="[PAD]")
    if truncate:
        tok.enable_truncation(max_length=truncate)
    assert len(tok.encode("kazo mira").ids) == pad_to  # the file pads, as BERT-family ones do
    cfg = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # peaked logits: greedy is decided far above float32 rounding
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.7 if "embed" in name else 1.0 / p.shape[1] ** 0.5)
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(dst, safe_serialization=True)
    tok.save(str(dst / "tokenizer.json"))
    return dst


def test_prompts_are_not_padded_by_the_tokenizer_file(tmp_path, live):
    folder = _padded_folder(tmp_path / "padded")
    g = compile_decoder(folder, max_seq_len=256, kv_blocks=64)
    text = "kazo mira te lu ne so"
    ids = [WORDS.index(w) + 2 for w in text.split()]
    assert g.tokenizer.encode(text) == ids
    by_text = g.generate([text], max_new_tokens=N)[0]
    by_ids = g.generate([ids], max_new_tokens=N)[0]
    assert by_text.prompt_ids == ids
    assert by_text.token_ids == by_ids.token_ids == hf_greedy(folder, ids, N)
    out = live(g).complete(prompt=text, max_tokens=N, temperature=0)
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert out["choices"][0]["text"] == str(by_ids)


def test_prompts_are_not_truncated_by_the_tokenizer_file(tmp_path):
    folder = _padded_folder(tmp_path / "truncating", pad_to=8, truncate=4)
    g = compile_decoder(folder, max_seq_len=64, kv_blocks=16)
    text = " ".join(WORDS[:10])
    assert g.tokenizer.encode(text) == [i + 2 for i in range(10)]


# ---- temperatures too small to divide by ----------------------------------------------------

TINY = [1e-310, 5e-324, 2e-308, 1e-6]


def test_a_tiny_temperature_is_greedy_in_the_sampling_params():
    for t in TINY + [0.0, GREEDY_TEMPERATURE / 2]:
        assert SamplingParams(temperature=t).temperature == 0.0
    assert SamplingParams(temperature=GREEDY_TEMPERATURE).temperature == GREEDY_TEMPERATURE
    assert SamplingParams(temperature=0.7).temperature == 0.7


def test_a_tiny_temperature_is_greedy_through_the_api(gen):
    greedy = gen.generate([PROMPTS[0]], max_new_tokens=N)[0]
    for t in TINY:
        for seed in (0, 1, 2):
            out = gen.generate([PROMPTS[0]], max_new_tokens=N, temperature=t, seed=seed)[0]
            assert out.token_ids == greedy.token_ids, (t, seed)
        assert "".join(gen.stream(PROMPTS[0], max_new_tokens=N, temperature=t, seed=5)) == greedy


def test_a_tiny_temperature_is_greedy_through_v1_completions(gen, live):
    srv = live(gen)
    greedy = srv.complete(prompt=PROMPTS[0], max_tokens=N, temperature=0)["choices"][0]["text"]
    assert greedy == gen.generate([PROMPTS[0]], max_new_tokens=N)[0]
    for t in TINY:
        for seed in (0, 1):
            out = srv.complete(prompt=PROMPTS[0], max_tokens=N, temperature=t, seed=seed)
            assert out["choices"][0]["text"] == greedy, (t, seed)


# ---- corrupt config.json --------------------------------------------------------------------

CFG = {
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
}
NAN, INF = float("nan"), float("inf")
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "change, field, value, allowed",
    [
        ({"rope_theta": 0}, "rope_theta", "0", "> 0"),
        ({"rope_theta": -10000.0}, "rope_theta", "-10000.0", "> 0"),
        ({"rope_theta": NAN}, "rope_theta", "nan", "> 0"),
        ({"rope_theta": INF}, "rope_theta", "inf", "> 0"),
        ({"rope_theta": 1e-45}, "rope_theta", "1e-45", "float32"),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
            "rope_parameters.rope_theta",
            "-1.0",
            "> 0",
        ),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor", "0", "> 0"),
        (
            {"rope_scaling": {**LLAMA3, "low_freq_factor": -1.0}},
            "rope_scaling.low_freq_factor",
            "-1.0",
            "> 0",
        ),
        (
            {"rope_scaling": {**LLAMA3, "high_freq_factor": 1.0}},
            "rope_scaling.high_freq_factor",
            "1.0",
            "greater than rope_scaling.low_freq_factor",
        ),
        (
            {"rope_scaling": {**LLAMA3, "original_max_position_embeddings": 0}},
            "rope_scaling.original_max_position_embeddings",
            "0",
            "[1, ",
        ),
        ({"rms_norm_eps": 0}, "rms_norm_eps", "0", "(0, 1)"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps", "-1e-06", "(0, 1)"),
        ({"rms_norm_eps": NAN}, "rms_norm_eps", "nan", "(0, 1)"),
        ({"rms_norm_eps": INF}, "rms_norm_eps", "inf", "(0, 1)"),
        ({"num_hidden_layers": 0}, "num_hidden_layers", "0", "[1, 1024]"),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers", "1000000000000", "[1, 1024]"),
        ({"num_hidden_layers": INF}, "num_hidden_layers", "inf", "[1, 1024]"),
        ({"vocab_size": 0}, "vocab_size", "0", "[1, 2147483647]"),
        ({"vocab_size": NAN}, "vocab_size", "nan", "[1, 2147483647]"),
        ({"hidden_size": 0}, "hidden_size", "0", "[1, "),
        ({"intermediate_size": 0}, "intermediate_size", "0", "[1, "),
        ({"num_attention_heads": 0}, "num_attention_heads", "0", "[1, "),
        ({"num_key_value_heads": 0}, "num_key_value_heads", "0", "[1, 4]"),
        ({"num_key_value_heads": 8}, "num_key_value_heads", "8", "[1, 4]"),
        ({"num_key_value_heads": 3}, "num_key_value_heads", "3", "one of 1, 2, 4"),
        ({"num_attention_heads": 6}, "num_attention_heads", "6", "a divisor of 64"),
        ({"head_dim": 15}, "head_dim", "15", "even integer in [2, "),
        ({"max_position_embeddings": 0}, "max_position_embeddings", "0", "[1, "),
    ],
)
def test_a_corrupt_config_is_refused_naming_field_value_and_range(change, field, value, allowed):
    cfg = {**CFG, **change}
    with pytest.raises(CheckpointError) as e:
        spec_from_config(cfg, Path("config.json"))
    msg = str(e.value)
    assert f"'{field}' is {value}" in msg and allowed in msg, msg


def test_a_corrupt_config_is_refused_before_the_weights_are_read(tmp_path, llama):
    """No weight file is opened (and nothing sized by the bad field allocated): a folder with a
    corrupt config and no weights at all still gets the config's message."""
    for change, field in (
        ({"num_hidden_layers": 10**12}, "num_hidden_layers"),
        ({"rope_theta": 0}, "rope_theta"),
        ({"vocab_size": 0}, "vocab_size"),
    ):
        folder = tmp_path / field
        folder.mkdir()
        cfg = json.loads((llama / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(CheckpointError, match=f"'{field}' is "):
            load_decoder(folder)


def test_the_cpu_head_dim_limit_is_named(llama):
    from dataclasses import replace

    from zoi.decoder.cpu import CpuBackend

    spec, _, _ = load_decoder(llama)
    with pytest.raises(InputError, match="head_dim 1024 is over the CPU decoder's limit of 512"):
        CpuBackend(replace(spec, head_dim=1024), {})


def test_a_valid_config_still_loads(llama):
    spec, weights, _ = load_decoder(llama)
    assert spec.num_layers == 3 and np.isfinite(weights["lm_head.weight"]).all()
