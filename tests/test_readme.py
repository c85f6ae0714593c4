"""The README's Python API block, run as written; only the placeholder folder is
replaced by a small real checkpoint and `texts` is given."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_readme_python_api_block(small_bert, tmp_path, monkeypatch):
    api = README[README.index("## Python API") :]
    (code,) = re.findall(r"```python\n(.*?)```", api, flags=re.S)[:1]
    assert 'zoi.compile("path/to/hf-folder"' in code
    code = code.replace("path/to/hf-folder", str(small_bert))
    monkeypatch.chdir(tmp_path)  # engine.save("minilm-int8") writes here
    texts = ["A man is eating food.", "A man eats.", "something else entirely"] * 3
    ns: dict = {"texts": texts}
    exec(compile(code, "README.md[python api]", "exec"), ns)
    assert (tmp_path / "minilm-int8" / "zoi.json").is_file()
    assert ns["one"].shape == (ns["engine"].spec.hidden,) and ns["one"].dtype == np.float32
    assert ns["emb"].shape == (len(texts), ns["engine"].spec.hidden)
    assert ns["engine"].precision == "int8"
