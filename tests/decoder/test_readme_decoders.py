"""The README's decoder block, run as written on a small random-init checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def test_readme_decoder_block(ckpt):
    sec = README[README.index("## Decoders") :]
    code = re.findall(r"```python\n(.*?)```", sec, flags=re.S)[0]
    assert 'zoi.compile("path/to/decoder-folder", precision="int8"' in code  # int8: W8A8
    ns: dict = {}
    exec(
        compile(
            code.replace("path/to/decoder-folder", str(ckpt("qwen3"))),
            "README.md[decoders]",
            "exec",
        ),
        ns,
    )
    assert ns["gen"].precision == "int8"
    assert len(ns["outs"]) == 2 and all(isinstance(o, str) for o in ns["outs"])
    assert (
        len(ns["outs"][0].token_ids) == 32
        and isinstance(ns["text"], str)
        and isinstance(ns["reply"], str)
    )
