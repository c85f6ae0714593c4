"""model.py of a zoi model in a Triton model repository (written by `zoi export triton`).

Triton's Python backend runs this file in its stub process, one per instance. `initialize`
loads the zoi artifact once (on the instance's GPU for KIND_GPU, else the CPU); `execute`
gets every request of a dynamic batch and runs them all as one packed engine call, no
padding. zoi must be importable by the stub's Python (install zoi there, or list its folders
in the config parameter `zoi_python_path`, or pack an environment for EXECUTION_ENV_PATH).
"""

import json
import os
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        for p in reversed([p for p in params.get("zoi_python_path", "").split(os.pathsep) if p]):
            if p not in sys.path:
                sys.path.insert(0, p)
        from zoi.integrations.triton_runtime import RequestError, open_runner

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
