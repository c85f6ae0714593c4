"""QuantConfig: every choice the quantiser makes, with the defaults used by `zoi compile --precision int8`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

ACT_SCHEMES = ("dynamic", "dynamic_asym", "static")
# what a backend may declare it runs (QuantConfig.restricted_to): the original contract is
# {"dynamic", "static"}; the defaults need "dynamic_asym" and "act_mul"
FEATURES = ("dynamic", "static", "dynamic_asym", "act_mul", "act_shift", "weight_only")
SMOOTH_MODES = ("auto", "on", "off")


@dataclass
class QuantConfig:
    # activations: "dynamic_asym" (per token, asymmetric UINT8 with a zero point; default),
    # "dynamic" (per token, symmetric INT8) or "static" (per tensor, amax from the observer)
    activations: str = "dynamic_asym"
    # observer for the static scheme: "minmax" | "percentile" | "mse"
    observer: str = "mse"
    percentile: float = 99.99
    # SmoothQuant: "auto" (search alpha, keep it only if it helps on the calibration set),
    # "on" (always, alpha searched unless smooth_alpha is set), "off"
    smoothquant: str = "auto"
    smooth_alpha: float | None = None
    alpha_grid: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7)  # one alpha for the model first,
    alpha_step: float = 0.1  # then each role (qkv, o, ffn1, ffn2) tries off and alpha +- step
    # where the migration may go. "fold": only where it folds exactly into weights kernels
    # already see (attention output projection <- the V rows of qkv). "act_mul": also the
    # linears reading LayerNorm outputs and the FFN down-projection, through a per-channel
    # multiplier `p.act_mul` applied to x before the activation is quantised (needs backend
    # support: see docs/QUANT.md).
    smooth_targets: str = "act_mul"
    # with "act_mul": also centre the channels of LayerNorm outputs (p.act_shift)
    smooth_shift: bool = False
    # error-compensating weight rounding (GPTQ, same per-channel scale, same format)
    gptq: bool = True
    gptq_damp: float = 0.01
    # how GPTQ's Gram weighs the calibration tokens (zoi.quant.calibrate.token_weights):
    # "token" (x^T x: a text weighs its length), "text" (every text the same), "pooled"
    # (1 / length**2: the mean-pooled output's error; short texts count most)
    gptq_weighting: str = "pooled"
    # GPTQ rounds the input channels in decreasing order of the Gram's diagonal
    gptq_act_order: bool = False
    # mixed precision: a linear whose output SQNR (dB) on calibration data is below this
    # stays FP32, worst first, while the weights stay under max_weight_ratio x FP32 bytes
    sensitivity_db: float = 30.0  # MiniLM's worst linear is at 38 dB: nothing falls back
    max_weight_ratio: float | None = 0.27
    # past the budget: "auto" keeps INT8 weights with FP32 activations (weight-only),
    # "fp32" stops at the budget, "int8" always uses weight-only (never FP32 weights)
    fallback_weights: str = "auto"
    # per-row INT8 word-embedding table
    int8_embedding: bool = True
    # calibration data: at most this many texts (the default set has 775, every domain);
    # the alpha search uses search_texts of them, shared by the domains (issue 21: 512 / 96
    # left the prose min and three domains' top-10 under target on MiniLM, docs/QUANT.md)
    max_calib_texts: int = 1024
    search_texts: int = 160
    sqnr_texts: int = 128
    chunk_tokens: int = 4096
    extra: dict = field(default_factory=dict)

    def validate(self) -> QuantConfig:
        if self.activations not in ACT_SCHEMES:
            raise ValueError(f"activations must be one of {ACT_SCHEMES}, got {self.activations!r}")
        from zoi.quant.observers import OBSERVERS

        if self.observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {OBSERVERS}, got {self.observer!r}")
        if self.smoothquant not in SMOOTH_MODES:
            raise ValueError(f"smoothquant must be one of {SMOOTH_MODES}, got {self.smoothquant!r}")
        if self.smooth_targets not in ("fold", "act_mul"):
            raise ValueError(
                f"smooth_targets must be 'fold' or 'act_mul', got {self.smooth_targets!r}"
            )
        if self.fallback_weights not in ("auto", "fp32", "int8"):
            raise ValueError(
                f"fallback_weights must be auto, fp32 or int8, got {self.fallback_weights!r}"
            )
        from zoi.quant.calibrate import GRAM_WEIGHTS

        if self.gptq_weighting not in GRAM_WEIGHTS:
            raise ValueError(
                f"gptq_weighting must be one of {GRAM_WEIGHTS}, got {self.gptq_weighting!r}"
            )
        if self.smooth_alpha is not None and not 0.0 <= self.smooth_alpha <= 1.0:
            raise ValueError("smooth_alpha must lie in [0, 1]")
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d["alpha_grid"] = list(self.alpha_grid)
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> QuantConfig:
        d = dict(d or {})
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown QuantConfig fields: {sorted(unknown)}")
        if "alpha_grid" in d:
            d["alpha_grid"] = tuple(d["alpha_grid"])
        return cls(**d).validate()

    def restricted_to(self, features) -> QuantConfig:
        """The closest config a backend that runs only `features` (see FEATURES) can execute:
        dynamic_asym -> dynamic, act_mul SmoothQuant -> exact folds only, no act_shift,
        weight-only fallback -> FP32 weights within the budget only."""
        import dataclasses

        f = set(features)
        unknown = f - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown quantisation features {sorted(unknown)}; known: {FEATURES}")
        c = dataclasses.replace(self)
        if c.activations not in f:
            c.activations = "dynamic" if "dynamic" in f else "static"
        if c.activations not in f:
            raise ValueError(f"the backend runs none of the activation schemes {ACT_SCHEMES}")
        if "act_mul" not in f:
            c.smooth_targets = "fold"
        if "act_shift" not in f:
            c.smooth_shift = False
        if "weight_only" not in f and c.fallback_weights != "fp32":
            c.fallback_weights = "fp32"
        return c.validate()

    @classmethod
    def coerce(cls, c) -> QuantConfig:
        if c is None:
            return cls().validate()
        if isinstance(c, QuantConfig):
            return c.validate()
        if isinstance(c, dict):
            return cls.from_dict(c)
        raise TypeError(f"quant_config must be a QuantConfig or a dict, got {type(c).__name__}")
