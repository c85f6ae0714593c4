"""The generator API on the CPU backend: queueing on a full pool, cancellation, stop strings,
limits, seeded sampling, streaming, chat templates, zoi.compile."""

from __future__ import annotations

import numpy as np
import pytest

import zoi
from zoi.decoder.api import KVPoolFull, SamplingParams
from zoi.decoder.compile import compile_decoder
from zoi.decoder.generator import Generator
from zoi.errors import InputError

from .dec_helpers import PROMPTS

pytest.importorskip("zoi._cpu")


@pytest.fixture(scope="module")
def gen(ckpt):
    return compile_decoder(
        ckpt("llama_gqa"), max_seq_len=128, kv_blocks=64, block_size=8, max_batch=4
    )


def test_zoi_compile_gives_a_generator(ckpt):
    g = zoi.compile(ckpt("llama_gqa"), max_seq_len=64)
    assert isinstance(g, Generator) and g.backend.max_seq_len == 64
    assert "llama" in repr(g)
    with pytest.raises(InputError):
        zoi.compile(ckpt("llama_gqa"), calibration=["x"])
    with pytest.raises(InputError):
        zoi.compile(ckpt("llama_gqa"), precision="fp16")


def test_backend_pool_full_and_freed(gen):
    be = gen.backend
    p = SamplingParams(max_new_tokens=68)
    ids = np.arange(1, 61, dtype=np.int32)
    need = be.blocks_needed(60, 68)
    assert need == 16  # ceil((60 + 68 - 1) / 8)
    for s in (100, 101, 102):
        be.add(s, ids, p)
    be.add(103, ids[:3], SamplingParams(max_new_tokens=4))
    assert be.pool().free_blocks == 64 - 3 * 16 - 1
    with pytest.raises(KVPoolFull, match="needs 16 blocks"):
        be.add(104, ids, p)  # 15 free
    be.cancel(100)
    be.add(104, ids, p)
    with pytest.raises(KVPoolFull, match="batch slots"):
        be.add(105, ids[:2], SamplingParams(max_new_tokens=2))  # 4 of 4 slots
    for s in (101, 102, 103, 104, 999):
        be.cancel(s)
    assert be.pool().free_blocks == 64 and be.pool().running == 0


def test_generate_queues_what_the_pool_cannot_hold(ckpt, gen):
    small = compile_decoder(
        ckpt("llama_gqa"), max_seq_len=128, kv_blocks=14, block_size=8, max_batch=4
    )
    prompts = PROMPTS + ["ka zo", "mi ra te lu ne"]
    want = gen.generate(prompts, max_new_tokens=40)
    got = small.generate(prompts, max_new_tokens=40)  # ~7 blocks each: two at a time
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert small.backend.pool().free_blocks == 14
    with pytest.raises(KVPoolFull):
        small.generate("kazo " * 30, max_new_tokens=90)  # needs more blocks than the pool has
    assert small.backend.pool().free_blocks == 14


def test_cancel_mid_generation_frees_blocks(gen):
    be = gen.backend
    alone = gen.generate([PROMPTS[1], PROMPTS[3]], max_new_tokens=30)
    it = gen.stream(PROMPTS[0], max_new_tokens=50)
    for _ in range(3):
        next(it)
    assert be.pool().running == 1
    it.close()
    assert be.pool().running == 0 and be.pool().free_blocks == 64
    # cancel one of two running sequences; the other goes on unchanged, a newcomer reuses the blocks
    a = np.asarray(gen.tokenizer.encode(PROMPTS[0]), np.int32)
    b = np.asarray(alone[0].prompt_ids, np.int32)
    c = np.asarray(alone[1].prompt_ids, np.int32)
    be.add(1, a, SamplingParams(max_new_tokens=30))
    be.add(2, b, SamplingParams(max_new_tokens=30))
    toks = {1: [], 2: [], 3: []}
    for step in range(30):
        if step == 5:
            be.cancel(1)
            be.add(3, c, SamplingParams(max_new_tokens=30))
        for e in be.step():
            toks[e.seq_id].append(e.token_id)
    for _ in range(6):
        for e in be.step():
            toks[e.seq_id].append(e.token_id)
    assert len(toks[1]) == 5
    assert toks[2] == alone[0].token_ids and toks[3] == alone[1].token_ids
    assert be.pool().free_blocks == 64


def test_stop_strings(gen):
    full = gen.generate(PROMPTS[0], max_new_tokens=48)[0]
    text = str(full)
    assert len(text) > 20
    stop = text[12:15]
    cut = text[: text.find(stop)]
    out = gen.generate(PROMPTS[0], max_new_tokens=48, stop=[stop, "\x00never"])[0]
    assert str(out) == cut and out.finish_reason == "stop"
    deltas = list(gen.stream(PROMPTS[0], max_new_tokens=48, stop=stop))
    assert "".join(deltas) == cut
    assert all(stop not in d for d in deltas)
    assert gen.backend.pool().running == 0 and gen.backend.pool().free_blocks == 64


def test_stop_token_ids_finish(gen):
    full = gen.generate(PROMPTS[2], max_new_tokens=30)[0]
    t = full.token_ids[7]
    k = full.token_ids.index(t)
    out = gen.generate(PROMPTS[2], max_new_tokens=30, stop_token_ids=[t])[0]
    # the stop token is counted (vLLM's token_ids and usage), its text is not in the completion
    assert out.token_ids == full.token_ids[: k + 1] and out.finish_reason == "stop"
    assert str(out) == gen.tokenizer.decode(full.token_ids[:k])


def test_stream_equals_generate(gen):
    for p in PROMPTS:
        want = gen.generate(p, max_new_tokens=40)[0]
        deltas = list(gen.stream(p, max_new_tokens=40))
        assert "".join(deltas) == str(want)
        assert all(d for d in deltas)


def test_over_long_prompts(gen):
    with pytest.raises(InputError, match="max_seq_len=128"):
        gen.generate("kazo " * 200)
    with pytest.raises(InputError, match="max_seq_len=128"):
        gen.backend.add(7, np.ones(100, np.int32), SamplingParams(max_new_tokens=29))
    ids = gen.tokenizer.encode("kazo " * 20)
    out = gen.generate([ids], max_new_tokens=500)[0]  # clamped to the context
    assert len(out.token_ids) == 128 - len(ids) and out.finish_reason == "length"
    with pytest.raises(InputError, match="empty"):
        gen.generate("")
    for bad in (
        dict(temperature=-1),
        dict(top_p=0),
        dict(top_k=-2),
        dict(max_new_tokens=0),
        dict(seed="x"),
    ):
        with pytest.raises(InputError):
            gen.generate("ka", **bad)


def test_seeded_sampling(gen):
    kw = dict(max_new_tokens=32, temperature=1.0, top_p=0.95)
    a = gen.generate(PROMPTS[:2], seed=11, **kw)
    b = gen.generate(PROMPTS[:2], seed=11, **kw)
    c = gen.generate(PROMPTS[:2], seed=12, **kw)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # a prompt's draws do not depend on what runs beside it
    alone = gen.generate(PROMPTS[1], seed=12, **kw)  # prompt i of a list draws with seed + i
    assert alone[0].token_ids == a[1].token_ids
    greedy = gen.generate(PROMPTS[:2], max_new_tokens=32)
    top1 = gen.generate(PROMPTS[:2], max_new_tokens=32, temperature=1.5, top_k=1, seed=3)
    assert [o.token_ids for o in top1] == [o.token_ids for o in greedy]


def test_chat_template_as_transformers(ckpt, gen):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(ckpt("llama_gqa")))
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "kazo mira? 日本"},
    ]
    want = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert gen.tokenizer.apply_chat_template(msgs) == want
    ids = tok(want, add_special_tokens=False).input_ids
    out = gen.chat(msgs, max_new_tokens=16)
    assert out.prompt_ids == ids
    assert out.token_ids == gen.generate([ids], max_new_tokens=16)[0].token_ids
    assert "".join(gen.chat(msgs, stream=True, max_new_tokens=16)) == str(out)
    for p in PROMPTS:
        assert gen.tokenizer.encode(p) == tok(p).input_ids


def test_eos_finishes(tmp_path):
    import json

    from zoi.decoder.synthetic import write_decoder

    d = write_decoder(
        tmp_path / "eos", arch="llama", heads=2, kv_heads=1, hidden=32, inter=40, layers=1
    )
    first = compile_decoder(d, max_seq_len=64).generate(PROMPTS[0], max_new_tokens=40)[0]
    eos = first.token_ids[9]  # make a token it produces the eos token (config.json eos_token_id)
    k = first.token_ids.index(eos)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eos_token_id"] = [eos]
    (d / "config.json").write_text(json.dumps(cfg))
    g = compile_decoder(d, max_seq_len=64)
    assert g.spec.eos_token_ids == (eos,)
    s = g.generate(PROMPTS[0], max_new_tokens=40)[0]
    assert s.token_ids == first.token_ids[: k + 1] and s.finish_reason == "stop"  # EOS counted
    assert str(s) == g.tokenizer.decode(first.token_ids[:k])
    assert (
        g.generate(PROMPTS[0], max_new_tokens=40, ignore_eos=True)[0].token_ids == first.token_ids
    )
    assert g.backend.pool().running == 0


def test_cli_generate_streams_to_stdout(ckpt, capsys):
    from zoi.cli import main

    want = compile_decoder(ckpt("llama_gqa"), max_seq_len=64).generate(
        PROMPTS[3], max_new_tokens=12
    )[0]
    assert (
        main(
            [
                "generate",
                str(ckpt("llama_gqa")),
                PROMPTS[3],
                "--max-new-tokens",
                "12",
                "--max-seq-len",
                "64",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == str(want) + "\n"
    assert main(["generate", str(ckpt("llama_gqa")), "x" * 10, "--max-seq-len", "4"]) == 2
    assert "max_seq_len=4" in capsys.readouterr().err


def test_precision_words_on_the_cpu(ckpt, tmp_path, monkeypatch):
    """One vocabulary with the encoders: "int8" is W8A8 ("w8a8" the same), handed to the CPU
    backend as "int8"; "w8" (weight-only INT8) runs on cuda only and is refused here, as is an
    unknown word, naming the choices, before the folder is read."""
    import zoi.decoder.cpu as cpu

    seen = []

    class Spy(cpu.CpuBackend):
        def __init__(self, *a, **kw):
            seen.append(kw["precision"])
            super().__init__(*a, **kw)

    monkeypatch.setattr(cpu, "CpuBackend", Spy)
    for word, want in (("fp32", "fp32"), ("int8", "int8"), ("w8a8", "int8")):
        g = compile_decoder(ckpt("llama_gqa"), precision=word, max_seq_len=32, max_batch=1)
        assert g.precision == want and seen[-1] == want and isinstance(g.backend, Spy), word
    g = zoi.compile(ckpt("llama_gqa"), device="auto", precision="w8a8", max_seq_len=32)
    assert g.precision == seen[-1] == "int8" and g.device == "cpu"
    missing = tmp_path / "not-a-folder"  # a refused precision never reaches the folder
    with pytest.raises(InputError, match=r"'w8' \(weight-only INT8\) runs on device='cuda' only"):
        compile_decoder(missing, precision="w8")
    with pytest.raises(InputError, match=r"'int8' \(W8A8"):
        compile_decoder(missing, precision="w8")  # and names the CPU's INT8 path
    for word in ("int4", "INT8", "", None):
        with pytest.raises(InputError, match=r"not supported .* use 'fp32' or 'int8' \(W8A8"):
            compile_decoder(missing, precision=word)
    with pytest.raises(InputError, match=r"'int8'.*'reference'; use 'fp32'$"):
        compile_decoder(missing, device="reference", precision="int8")
    with pytest.raises(InputError, match="device 'tpu' is not supported"):
        compile_decoder(missing, device="tpu")
    assert len(seen) == 4  # nothing refused built a backend


def test_cli_generate_precision_words(ckpt, capsys):
    from zoi.cli import main

    args = ["generate", str(ckpt("llama_gqa")), PROMPTS[3], "--max-new-tokens", "3", "-v"]
    assert main([*args, "--max-seq-len", "32", "--precision", "w8a8"]) == 0
    assert "int8 on" in capsys.readouterr().err  # the W8A8 path, by its one name
    assert main([*args, "--precision", "w8"]) == 2
    assert "weight-only INT8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--precision", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_incremental_decoder_never_splits_utf8(gen):
    from zoi.decoder.tokenizer import Detokenizer

    tok = gen.tokenizer
    # byte-level BPE: one token per byte (the GPT-2 byte -> unicode map)
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_tok = {b: tok.token_id(chr(c)) for b, c in zip(bs, cs, strict=True)}
    text = "a😀日é"
    ids = [byte_tok[b] for b in text.encode("utf-8")]
    assert None not in ids
    d = Detokenizer(tok.decode)
    deltas = [d.push(i) for i in ids]
    assert "".join(deltas) + d.flush() == text
    assert [x for x in deltas if x] == ["a", "😀", "日", "é"]
    assert all("\ufffd" not in x for x in deltas)


def test_stop_matcher_across_deltas():
    from zoi.decoder.tokenizer import StopMatcher

    m = StopMatcher(["</s>", "STOP"])
    outs = [m.feed(x) for x in ["ab", "c<", "/", "s>tail"]]
    assert outs == [("ab", False), ("c", False), ("", False), ("", True)]
    m = StopMatcher(["</s>"])
    assert [m.feed(x)[0] for x in ["x<", "/y"]] + [m.flush()] == ["x", "</y", ""]
    m = StopMatcher(["ST"])
    assert m.feed("aS") == ("a", False) and m.flush() == "S"


def test_text_stream_leaves_out_the_ending_token_and_stops():
    from zoi.decoder.tokenizer import TextStream

    def dec(ids):  # a byte tokenizer whose id 300 would show as text if decoded
        return "".join("<E>" if i == 300 else chr(i) for i in ids)

    t = TextStream(dec, [ord("p")], stops=["xy"], end_ids=[300])
    assert [t.push(i) for i in b"abx"] == ["a", "b", ""]  # "x" held: it may start "xy"
    assert t.push(300, "stop") == "x" and not t.stopped  # the EOS: no text of its own
    t = TextStream(dec, end_ids=[300])
    assert t.push(300, "length") == "<E>"  # not an ending by stop: its text is the model's
    t = TextStream(dec, stops=["xy"], end_ids=[300])
    assert t.push(ord("x")) == "" and t.push(ord("y")) == "" and t.stopped
    assert t.push(ord("z"), "length") == ""  # nothing after a stop string
