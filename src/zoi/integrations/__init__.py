"""Scale-out on engines users already run: NVIDIA Triton Inference Server and Ray Serve.

- `zoi.integrations.triton`: `zoi export triton` writes a Triton model repository (Python backend,
  dynamic batching, one instance group per GPU or CPU instances) and starts a `tritonserver`.
- `zoi.integrations.ray`: a Ray Serve deployment with one Engine per replica, serving the same
  routes as `zoi serve`; `zoi deploy ray`.
- `zoi.integrations.gpus`: GPU placement (which GPU ids, how many per replica), testable without one.

See docs/DEPLOY.md.
"""
