"""The CUDA backend's shape: modules of at most ~400 lines, switches passed in as
CudaOptions (no ZOI_* environment read inside the backend; only CudaOptions.from_env at the
engine's edge), shared Triton helpers written once."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from zoi.backends.cuda.options import CudaOptions

CUDA = Path(__file__).resolve().parents[2] / "src" / "zoi" / "backends" / "cuda"
PRODUCT = sorted(p for p in CUDA.glob("*.py") if p.name != "bench.py")


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: p.name)
def test_backend_modules_are_small(path):
    assert len(path.read_text().splitlines()) <= 400, path.name


@pytest.mark.parametrize("path", PRODUCT + sorted((CUDA / "kernels").glob("*.py")), ids=str)
def test_no_environment_switch_inside_the_backend(path):
    if path.name == "options.py":
        return
    src = path.read_text()
    assert not re.search(r"environ(\.get)?\s*[\[(]\s*['\"]ZOI_", src), path.name


def test_layernorm_and_softmax_written_once():
    """The row LayerNorm / online softmax / rint / activations live in kernels/common.py."""
    for p in (CUDA / "kernels").glob("*.py"):
        if p.name == "common.py":
            continue
        src = p.read_text()
        assert "12582912" not in src, p.name  # rint
        assert "tl.erf(" not in src, p.name  # gelu
        # two-pass LayerNorm (the persistent kernel's chunked one-pass statistics are another
        # algorithm: rows too wide for registers)
        assert not re.search(r"- mean\[:, None\], 0\.0\)", src), p.name
        assert "tl.exp2(m_i - m" not in src, p.name  # online softmax rescale


def test_options_from_env_is_the_only_environment_read():
    assert CudaOptions.from_env({"ZOI_CUDA_PATH_CACHE": "0"}) == CudaOptions()
    home = CudaOptions.from_env({})  # the only other default it sets: the path cache's file
    assert dataclasses.replace(home, path_cache=None) == CudaOptions()
    assert home.path_cache.endswith("zoi/cuda_paths.json")
    assert CudaOptions.from_env({"ZOI_PERSISTENT": "0"}).persistent == "off"
    assert CudaOptions.from_env({"ZOI_PERSISTENT": "1"}).persistent == "force"
    o = CudaOptions.from_env({"ZOI_PERSISTENT_SPLIT": "1", "ZOI_PERSISTENT_CFG": '{"BK": 64}'})
    assert o.persistent_split is True and o.persistent_cfg == {"BK": 64}
    with pytest.raises(ValueError, match="ZOI_PERSISTENT must be 0 or 1"):
        CudaOptions.from_env({"ZOI_PERSISTENT": "yes"})
    with pytest.raises(ValueError, match="not a JSON object"):
        CudaOptions.from_env({"ZOI_PERSISTENT_CFG": "[1"})
    with pytest.raises(ValueError, match="persistent must be one of"):
        CudaOptions(persistent="sometimes")
    assert CudaOptions().replace(pdl_max_tokens=16, pdl=None) == CudaOptions(pdl_max_tokens=16)


def test_arena_offsets_come_from_the_graph_planner():
    """The CUDA launch list's buffers (int8 copies, quantize outputs included) are placed by
    zoi.graph.planner.place_buffers: no two buffers live at the same launch share bytes."""
    pytest.importorskip("triton")
    from tests.cuda_backend.cuda_helpers import MIXED, tiny_model

    from zoi.backends.cuda.arena import place
    from zoi.backends.cuda.plan import plan_launches

    model = tiny_model("int8", max_tokens=64, **MIXED)
    launches = plan_launches(model)["launches"]
    offs, cols, total = place(launches, 64)
    spans = {}
    for i, la in enumerate(launches):  # live range of every buffer, as place() sees it
        names = [la.out] + ([la.extra["q"]] if la.kind != "quantize" and la.extra.get("q") else [])
        reads = la.ins + ([la.res] if la.res else [])
        if la.kind == "linear" and la.prequant:
            reads = [la.extra["qname"]] + reads[1:]
        for n in reads:
            if n in spans:
                spans[n][1] = i
        for n in names if la.kind != "pool" else []:
            spans[n] = [i, i]
    assert set(spans) == set(offs)
    size = {n: 64 * cols[n] * (1 if n.endswith("#q") else 2) for n in offs}
    for a in offs:
        for b in offs:
            if a < b and spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                assert offs[a] + size[a] <= offs[b] or offs[b] + size[b] <= offs[a], (a, b)
    assert total >= max(offs[n] + size[n] for n in offs)


def test_attention_and_its_step_written_once():
    """One varlen attention kernel (the extras: its constexpr switches, kernels/attention.py),
    one tile -> sequence prologue, one step builder in steps.py; NaN-keeping amax everywhere
    (kernels/common.py amax_rows, not a plain tl.max of |y|)."""
    kernels = CUDA / "kernels"
    for p in kernels.glob("*.py"):
        src = p.read_text()
        if p.name != "attention.py":
            assert "tcum_ptr + tl.maximum(b - 1, 0)" not in src, p.name
        assert not re.search(r"tl\.max\(tl\.where\([^)]*tl\.abs\(", src), p.name
    assert (CUDA / "steps.py").read_text().count("launch_attention(") == 1


def test_the_environment_is_read_at_the_api_edge_and_passed_down(monkeypatch, tmp_path):
    """zoi.compile / zoi.load read CudaOptions.from_env (engine._cuda_options) and the Engine
    hands that object to make_backend; make_backend itself reads no environment."""
    import zoi.engine as E
    from zoi import backends

    monkeypatch.setenv("ZOI_PERSISTENT", "1")
    monkeypatch.setenv("ZOI_CACHE_DIR", str(tmp_path))
    o = E._cuda_options("cuda")
    assert o.persistent == "force" and o.path_cache == str(tmp_path / "cuda_paths.json")
    assert E._cuda_options("cpu") is None
    seen = {}

    def fake_make_backend(
        model, device, device_index=None, threads=None, cuda_options=None, cpu_options=None
    ):
        seen.update(device=device, options=cuda_options, cpu=cpu_options)
        raise RuntimeError("stop")

    class _Model:
        spec = None

    monkeypatch.setattr(E, "make_backend", fake_make_backend)
    monkeypatch.setattr(E, "head_backend", lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="stop"):
        E.Engine(_Model(), None, "cuda", cuda_options=o)
    assert seen == {"device": "cuda", "options": o, "cpu": None}
    # the CPU core's options likewise: read at the edge (E._cpu_options), handed down
    monkeypatch.setenv("ZOI_NUM_THREADS", "1")
    c = E._cpu_options("cpu")
    assert c.num_threads == 1 and E._cpu_options("cuda") is None
    with pytest.raises(RuntimeError, match="stop"):
        E.Engine(_Model(), None, "cpu", cpu_options=c)
    assert seen == {"device": "cpu", "options": None, "cpu": c}
    src = (Path(backends.__file__)).read_text()
    assert "from_env(" not in src.replace("CudaOptions.from_env())", "")  # the docstring's mention
