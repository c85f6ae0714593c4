"""QuantMode: the one name of a linear's INT8 activation scheme, for the IR, both backends
and the docs. Its value is the string artifacts store in ``LinearQuant.scheme``
(a ``str`` enum: ``QuantMode.STATIC == "static"``), so saved artifacts read unchanged.

| mode | activations | weights |
|---|---|---|
| ``FLOAT`` ("fp32") | float (fp32 on the CPU, fp16 on the GPU); weight-only INT8 dequantised | float |
| ``DYNAMIC`` | per-token symmetric int8, scale = amax / 127 | per-channel int8 |
| ``STATIC`` | per-tensor symmetric int8 from a calibrated amax | per-channel int8 |
| ``DYNAMIC_ASYM`` | per-token asymmetric uint8 (scale, zero point) | per-channel int8 |
| ``FP8`` ("fp8") | per-token E4M3, scale = amax / 448 | per-channel E4M3 (zoi.numerics.fp8) |

``quantized``: any mode but FLOAT (INT8 or FP8); ``is_int8``: the three INT8 schemes only.

The backends map it to their own codes at their edge only: ``kernel_code`` is the Triton
kernels' ``QMODE`` constexpr (and the C++ ``QuantOut`` mode the CPU core takes).
"""

from __future__ import annotations

from enum import Enum


class QuantMode(str, Enum):
    FLOAT = "fp32"
    DYNAMIC = "dynamic"
    STATIC = "static"
    DYNAMIC_ASYM = "dynamic_asym"
    FP8 = "fp8"  # precision="fp8": E4M3 weights and activations (Hopper / Ada GPUs)

    __hash__ = str.__hash__  # dict keys and lookups interchangeable with the plain strings

    def __str__(self) -> str:
        return self.value

    @property
    def is_int8(self) -> bool:
        return self not in (QuantMode.FLOAT, QuantMode.FP8)

    @property
    def quantized(self) -> bool:
        """INT8 or FP8: the linear's weights and activations are quantised."""
        return self is not QuantMode.FLOAT

    @property
    def kernel_code(self) -> int:
        """The kernels' QMODE: 0 none (float), 1 dynamic, 2 static, 3 dynamic_asym, 5 fp8."""
        return _CODES[self]

    @classmethod
    def parse(cls, scheme, where: str = "") -> QuantMode:
        """A scheme string (or None: DYNAMIC, the default of an INT8 linear) as a QuantMode;
        an unknown one raises ValueError naming the modes."""
        if scheme is None:
            return cls.DYNAMIC
        try:
            return cls(scheme)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(
                f"{where + ': ' if where else ''}unknown INT8 scheme {scheme!r} (the modes: {names})"
            ) from None

    @classmethod
    def coerce(cls, scheme):
        """QuantMode for a known scheme string, the value unchanged otherwise (the loader
        reports unknown ones with the artifact's context)."""
        try:
            return cls(scheme)
        except ValueError:
            return scheme


_CODES = {
    QuantMode.FLOAT: 0,
    QuantMode.DYNAMIC: 1,
    QuantMode.STATIC: 2,
    QuantMode.DYNAMIC_ASYM: 3,
    QuantMode.FP8: 5,
}
