"""Native tokenizers against HF `tokenizers`: texts -> ids, one thread. Byte-level BPE
(zoi._cpu.ByteBPE: Qwen3, GPT-2), Unigram and SentencePiece BPE (zoi._cpu.SentencePiece:
XLM-R, Gemma).

Builds the tokenizer.json files locally (no download): byte-level BPEs trained with HF's
BpeTrainer on half of the bench corpus's lines plus the bundled calibration corpora (with
--stdlib, plus the Python standard library's sources, ~13 MB: a 50k vocabulary whose merges
look like a real one's), under Qwen2 / Qwen3's configuration (NFC, the Qwen Split regex,
specials, <|endoftext|> appended) and GPT-2's (ByteLevel with its regex); and, when
sentencepiece and transformers are installed, a Unigram and a byte_fallback BPE trained by
sentencepiece on the same lines (its nmt_nfkc charsmap) and converted by transformers as
XLM-R's (Precompiled, WhitespaceSplit + Metaspace, <s> A </s>) and Gemma's (Replace " " ->
"▁", <bos> A) files. The texts are the other half of the bench corpus's lines (real
sentences the model was not trained on), the first --texts of them, and the multilingual
eval lines in a second row.

Both sides run one thread, the calling one: the native call with nthreads=1, HF's
encode_batch with TOKENIZERS_PARALLELISM=false, in one process, interleaved, the best of
--reps runs each. The time is the calling thread's CPU time (time.thread_time), so a shared,
loaded machine does not count other processes' time against either side.
"warm": after a warm-up call (both keep a per-word cache: HF's in the model, the native one
per thread and a per-vocab-entry memo); "cold": the first call of a fresh instance of each.
The ids are checked equal before anything is timed.

    python bench/tokenizer_speed.py                    # 1000 sentences, small corpus (~30 s)
    python bench/tokenizer_speed.py --kinds xlmr gemma # the SentencePiece files only
    python bench/tokenizer_speed.py --stdlib --vocab 50000   # a 50k vocabulary (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import sysconfig  # noqa: E402

from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from tokenizers.models import BPE  # noqa: E402

from zoi.frontend import bpe  # noqa: E402
from zoi.frontend.tokenizer import Tokenizer as ZoiTokenizer  # noqa: E402

DATA = REPO / "src" / "zoi" / "data"
CORPUS = REPO / "src" / "zoi" / "bench" / "data" / "corpus.txt"


def lines(p: Path) -> list[str]:
    return [x for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]


def build(kind: str, vocab: int, train: list[str]) -> str:
    tok = Tokenizer(BPE())
    if kind == "qwen3":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(bpe.QWEN2_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>"]
    tr = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(train, tr)
    if kind == "qwen3":
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
        )
    return tok.to_str()


def build_spm(kind: str, vocab: int, train: list[str]) -> str:
    """A sentencepiece model on `train`, converted by transformers: XLM-R's Unigram file or
    Gemma's byte_fallback BPE file (with its <bos> template)."""
    import sentencepiece as spm
    import transformers

    with tempfile.TemporaryDirectory() as d:
        text = Path(d) / "train.txt"
        text.write_text("\n".join(train), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(text),
            model_prefix=str(Path(d) / "m"),
            model_type="unigram" if kind == "xlmr" else "bpe",
            vocab_size=vocab,
            hard_vocab_limit=False,
            byte_fallback=kind == "gemma",
            character_coverage=0.9995,
            minloglevel=2,
        )
        folder = Path(d) / "tok"
        folder.mkdir()
        name = "sentencepiece.bpe.model" if kind == "xlmr" else "tokenizer.model"
        (folder / name).write_bytes((Path(d) / "m.model").read_bytes())
        cls = transformers.XLMRobertaTokenizer if kind == "xlmr" else transformers.GemmaTokenizer
        cls.from_pretrained(str(folder)).save_pretrained(str(folder / "out"))
        tj = json.loads((folder / "out" / "tokenizer.json").read_text(encoding="utf-8"))
    if kind == "gemma":  # Gemma's files prepend <bos>
        bos = next(a["id"] for a in tj["added_tokens"] if a["content"] == "<bos>")
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos], "tokens": ["<bos>"]}},
        }  # fmt: skip
    return json.dumps(tj)


clock = time.thread_time


def best_of(fn, reps: int) -> float:
    fn()  # warm-up: both tokenizers cache words
    best = float("inf")
    for _ in range(reps):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def row(name: str, js: str, texts: list[str], reps: int) -> float:
    z = ZoiTokenizer(js, 1 << 16)
    assert z.native is not None, z.kind
    nat = z.native
    hf = Tokenizer.from_str(js)
    hf.no_truncation()
    hf.no_padding()
    ids, _, cu, _ = nat.encode_packed(texts, True, 0, 1, 0)
    want = [e.ids for e in hf.encode_batch(texts)]
    got = [ids[cu[i] : cu[i + 1]].tolist() for i in range(len(texts))]
    assert got == want, "native ids differ from HF's"
    n_tok = len(ids)
    # interleaved: each round times HF then native, so load on the machine hits both
    t_hf, t_nat = float("inf"), float("inf")
    for _ in range(3):
        t_hf = min(t_hf, best_of(lambda: hf.encode_batch(texts), max(1, reps // 3)))
        t_nat = min(
            t_nat, best_of(lambda: nat.encode_packed(texts, True, 0, 1, 0), max(1, reps // 3))
        )
    c_hf, c_nat = float("inf"), float("inf")
    for _ in range(reps):
        fresh = Tokenizer.from_str(js)
        t = clock()
        fresh.encode_batch(texts)
        c_hf = min(c_hf, clock() - t)
        fresh = ZoiTokenizer(js, 1 << 16, validate=False).native
        t = clock()
        fresh.encode_packed(texts, True, 0, 1, 0)
        c_nat = min(c_nat, clock() - t)
    nbytes = sum(len(t.encode()) for t in texts)
    print(
        f"{name:<31} {len(texts):>4} texts {n_tok:>6} tokens {nbytes / 1e3:>5.1f} KB | warm: "
        f"HF {t_hf * 1e3:6.2f} ms native {t_nat * 1e3:6.3f} ms {t_hf / t_nat:5.1f}x | cold: "
        f"HF {c_hf * 1e3:6.2f} ms native {c_nat * 1e3:6.3f} ms {c_hf / c_nat:5.1f}x"
    )
    return min(t_hf / t_nat, c_hf / c_nat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=1000, help="sentences per batch")
    ap.add_argument("--vocab", type=int, default=32000, help="BPE vocabulary size to train")
    ap.add_argument("--reps", type=int, default=15, help="timed runs per side (best kept)")
    ap.add_argument("--stdlib", action="store_true", help="train on the stdlib sources too")
    ap.add_argument(
        "--kinds", nargs="+", default=["qwen3", "gpt2", "xlmr", "gemma"],
        choices=["qwen3", "gpt2", "xlmr", "gemma"], help="which files to build and time",
    )  # fmt: skip
    args = ap.parse_args()
    corpus = lines(CORPUS)
    held_out = corpus[1::2]
    train = corpus[0::2]
    for p in sorted(DATA.glob("calib*.txt")) + [DATA / "calibration.txt"]:
        train += lines(p)
    if args.stdlib:
        std = Path(sysconfig.get_paths()["stdlib"])
        for f in sorted(std.rglob("*.py")):
            if "site-packages" not in f.parts and "test" not in f.parts:
                train += lines(f)
    texts = held_out[: args.texts]
    multi = lines(DATA / "eval_multilingual.txt")
    print(
        f"tokenizers {__import__('tokenizers').__version__}, one thread each; best of {args.reps}"
    )
    files = {}
    for kind in args.kinds:  # all threads
        if kind in ("qwen3", "gpt2"):
            files[kind] = build(kind, args.vocab, train)
            continue
        try:
            files[kind] = build_spm(kind, args.vocab, train)
        except ImportError as e:
            print(f"{kind}: skipped ({e}; pip install sentencepiece transformers)")
    # the timed calls: one thread (read by HF at each call)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    ratios = []
    for kind, js in files.items():
        print(f"{kind}: vocabulary {Tokenizer.from_str(js).get_vocab_size()}")
        ratios.append(row(f"{kind}: bench corpus sentences", js, texts, args.reps))
        row(f"{kind}: multilingual sentences", js, multi, args.reps)
    if ratios:
        print(
            f"native / HF speed-up on the bench sentences, warm or cold: {min(ratios):.1f}x or more"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
