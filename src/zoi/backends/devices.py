"""GPU placement, written for any number of GPUs and decided (and tested) without one.

`parse_gpus` turns a `--gpus` value into a placement: None (CPU only), ALL (every GPU the
process sees; how many is known only where it runs) or an explicit list of device ids;
`resolve_gpus` gives the ids a placement names on a machine. Used by `zoi serve --gpus`
(zoi.serve.replicas: one engine per GPU), `zoi export triton --gpus` (one instance group per
GPU) and `zoi deploy ray --gpus` (one replica per GPU).
"""

from __future__ import annotations

ALL = "all"


def parse_gpus(value: str | None) -> None | str | list[int]:
    """'' / None / 'none' / 'cpu' -> None; 'all' -> ALL; '0,1' or '0 1' -> [0, 1] (sorted, unique)."""
    if value is None:
        return None
    v = str(value).strip().lower()
    if v in ("", "none", "cpu"):
        return None
    if v == ALL:
        return ALL
    ids = []
    for part in v.replace(" ", ",").split(","):
        if not part:
            continue
        try:
            i = int(part)
        except ValueError:
            raise ValueError(
                f"--gpus {value!r}: expected 'all' or a list of GPU ids like 0,1 ({part!r} is not "
                "an integer)"
            ) from None
        if i < 0:
            raise ValueError(f"--gpus {value!r}: GPU ids are >= 0, got {i}")
        ids.append(i)
    if not ids:
        raise ValueError(f"--gpus {value!r}: no GPU id given (use 'all' or e.g. 0,1)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {value!r}: GPU id listed twice")
    return sorted(ids)


def visible_gpu_count() -> int:
    """GPUs the CUDA driver shows this process (0 without a driver or cuda-bindings)."""
    try:
        from cuda.bindings import driver  # type: ignore
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore  # older cuda-python
        except ImportError:
            return 0
    try:
        (err,) = driver.cuInit(0)
        if int(err) != 0:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if int(err) == 0 else 0
    except Exception:
        return 0


def resolve_gpus(placement: None | str | list[int], count: int | None = None) -> list[int]:
    """The device ids a placement names on a machine with `count` GPUs (default: visible ones)."""
    if placement is None:
        return []
    n = visible_gpu_count() if count is None else int(count)
    if placement == ALL:
        if n == 0:
            raise ValueError(
                "--gpus all: no CUDA GPU is visible here (use the CPU: leave --gpus out)"
            )
        return list(range(n))
    bad = [i for i in placement if i >= n]
    if bad:
        raise ValueError(
            f"--gpus {','.join(map(str, placement))}: GPU {bad[0]} does not exist here "
            f"({n} visible; ids 0..{n - 1})"
        )
    return list(placement)
