"""model.py of a zoi model in a Triton model repository (written by `zoi export triton`).

Triton's Python backend runs this file in its stub process, one per instance. `initialize`
loads the zoi artifact once (on the instance's GPU for KIND_GPU, else the CPU); `execute`
gets every request of a dynamic batch and runs them all as one packed engine call, no
padding. zoi must be importable by the stub's Python (install zoi there, or list its folders
in the config parameter `zoi_python_path`, or pack an environment for EXECUTION_ENV_PATH).

When that Python cannot run zoi, Triton itself reports little more than "failed to load", so
every import here is checked: the error, the interpreter it happened in and the environment
this file needs go to the server log (and into the load error Triton shows for the model).
"""

import json
import os
import sys

# What the stub's Python needs, said wherever an import fails (zoi may be the missing part, so
# the text lives here rather than in zoi).
ENVIRONMENT = (
    "tritonserver's Python backend runs model.py with the first `python3` on tritonserver's "
    "PATH (that Python's libpython must be on LD_LIBRARY_PATH). That Python needs numpy < 2 "
    "(the Python backend of tritonserver 2.51 / nvidia-pytriton 0.7.0 is built for numpy 1.x), "
    "tokenizers, safetensors and zoi (installed there, or its folders in the config parameter "
    "zoi_python_path). The tested environment: run scripts/triton_env.sh in the zoi checkout "
    "(it builds .venv-triton), then start tritonserver with .venv-triton/bin first on PATH "
    "(docs/DEPLOY.md, 'Where zoi comes from inside Triton'). Check an interpreter before "
    "starting the server: zoi export triton ART REPO --check --python PATH/TO/python3"
)


def _where() -> str:
    np_version = "not importable"
    np_mod = sys.modules.get("numpy")
    if np_mod is not None:
        np_version = getattr(np_mod, "__version__", "?")
    return f"the Python at {sys.executable} (Python {sys.version.split()[0]}, numpy {np_version})"


def _report(message: str) -> str:
    """Log message through Triton's logger, or on stderr (the server log too) without one."""
    logger = getattr(globals().get("pb_utils"), "Logger", None)
    try:
        logger.log_error(message)
    except Exception:  # no Triton module, or an older backend without a working Logger
        print(f"zoi model.py: {message}", file=sys.stderr, flush=True)
    return message


def _import_failed(what: str, e: BaseException) -> ImportError:
    return ImportError(
        _report(f"cannot import {what} in {_where()}: {type(e).__name__}: {e}. {ENVIRONMENT}")
    )


try:
    import triton_python_backend_utils as pb_utils
except Exception as e:  # outside Triton's stub, or a broken backend install
    raise _import_failed("triton_python_backend_utils (Triton's Python backend)", e) from e


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        for p in reversed([p for p in params.get("zoi_python_path", "").split(os.pathsep) if p]):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            import numpy
        except Exception as e:
            raise _import_failed("numpy", e) from e
        allow2 = params.get("zoi_allow_numpy2", "").strip().lower() in ("1", "true", "yes")
        if int(numpy.__version__.split(".")[0]) >= 2 and not allow2:
            # the stub of tritonserver 2.51 dies on the first BYTES request under numpy 2
            # (its tensors are decoded as numpy 1.x lays them out): refuse at load instead
            raise RuntimeError(
                _report(
                    f"numpy {numpy.__version__} in {_where()}: the Python backend of "
                    "tritonserver 2.51 (nvidia-pytriton 0.7.0) is built for numpy 1.x, and under "
                    "numpy 2 its stub dies on the first request. "
                    f"{ENVIRONMENT}. With a tritonserver whose Python backend is built for "
                    'numpy 2, set the config parameter zoi_allow_numpy2 to "true"'
                )
            )
        try:
            from zoi.integrations.triton_runtime import RequestError, open_runner
        except Exception as e:
            raise _import_failed("zoi", e) from e

        self._request_error = RequestError
        model_dir = os.path.join(args["model_repository"], args["model_version"])
        self.runner = open_runner(
            model_dir,
            params,
            args.get("model_instance_kind", "CPU"),
            args.get("model_instance_device_id", "0"),
        )

    def _error(self, e):
        code = None
        if isinstance(e, self._request_error) or isinstance(e, ValueError):
            code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        msg = f"zoi: {e}" if code is not None else f"zoi: the engine failed on this request: {e}"
        err = pb_utils.TritonError(msg, code) if code is not None else pb_utils.TritonError(msg)
        return pb_utils.InferenceResponse(output_tensors=[], error=err)

    def execute(self, requests):
        batch = []
        for req in requests:
            t = pb_utils.get_input_tensor_by_name(req, "TEXT")
            batch.append(t.as_numpy())
        out = []
        for res in self.runner.run(batch):
            if isinstance(res, Exception):
                out.append(self._error(res))
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", res)]))
        return out

    def finalize(self):
        self.runner = None
