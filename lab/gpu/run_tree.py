"""Run a script against another checkout's zoi package (an A/B of two trees in one machine's
minute): `python lab/gpu/run_tree.py OLD_SRC script.py args...` puts OLD_SRC first on sys.path and
drops the editable install's finder, which would otherwise map `zoi` to this checkout."""

import runpy
import sys

if __name__ == "__main__":
    src, script, *rest = sys.argv[1:]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
    sys.path.insert(0, src)
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")
