"""QuantConfig: every choice the quantiser makes, with the defaults used by `zoi compile --precision int8`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

ACT_SCHEMES = ("dynamic", "dynamic_asym", "static")
# what a backend may declare it runs (QuantConfig.restricted_to): the original contract is
# {"dynamic", "static"}; the defaults need "dynamic_asym" and "act_mul"
FEATURES = ("dynamic", "static", "dynamic_asym", "act_mul", "act_shift", "weight_only")
SMOOTH_MODES = ("auto", "on", "off")
SEARCH_ROUNDINGS = ("plain", "gptq")
# the compile budgets (`zoi compile --calibration`, `zoi.compile(calibration=...)`): presets
# of the fields below (QuantConfig.preset); docs/QUANT.md, "Calibration budgets"
CALIBRATION_BUDGETS = ("fast", "default", "thorough")
_PRESETS: dict[str, dict] = {
    # the search on half the texts, no per-role refinement, SQNR on half the texts:
    # about 0.6x of the default's quantiser time, fidelity a little under the default's
    "fast": {"search_texts": 160, "search_texts_wide": 80, "sqnr_texts": 64, "alpha_step": 0.0},
    "default": {},
    # every SmoothQuant candidate scored with the GPTQ rounding that ships, on twice the
    # texts: the search sees the weights the artifact will hold (about 3x the quantiser time)
    "thorough": {"search_rounding": "gptq", "search_texts": 480, "search_texts_wide": 320},
}


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
    # the alpha search uses search_texts of them, shared by the domains (512 / 96
    # left the prose min and three domains' top-10 under target on MiniLM, docs/QUANT.md)
    max_calib_texts: int = 1024
    search_texts: int = 320
    # ... for a model wider than 512 (all-mpnet-base-v2: hidden 768): each candidate's engine
    # run costs ~hidden**2 per token, 4x MiniLM's, so half the texts keep its compile in budget
    search_texts_wide: int = 160
    # ... and the GPTQ Grams of a wide model from at most this many calibration tokens (batches
    # spread over the set; 0: all): a Gram costs K**2 per token (MPNet's FFN down-projection,
    # K 3072, is 84% of them) and is what keeps a wide model's compile over its budget; every
    # other statistic still sees every token
    gram_tokens_wide: int = 6144
    sqnr_texts: int = 128
    chunk_tokens: int = 4096
    # how the SmoothQuant search rounds each candidate's weights: "plain" (to nearest: cheap,
    # but it overstates the weight error of the larger alphas, which GPTQ then mostly
    # removes, so it leans to small alphas) or "gptq" (the rounding that ships; each
    # (linear, alpha) rounded once and kept, the chosen candidate's integers are the artifact's)
    search_rounding: str = "plain"
    # the search's score per domain (the worst domain counts): "pairs", the RMS change of
    # the texts' pairwise cosine similarities (what reorders neighbours: top-10 agreement), or
    # "cos", mean(1 - cos) + the mean of the worst 2% (each text's own embedding error)
    search_score: str = "pairs"
    # the first row of each sequence (the [CLS] / attention-sink row, whose massive channels
    # take the per-token scale) quantised twice in every INT8 linear: q1 = Q(x), q2 = x - deq(q1)
    # at the step a_scale * 2**-8, one more INT8 row per sequence and linear (LinearQuant.first_row;
    # docs/QUANT.md "The first row of each sequence quantised twice"). The CPU core, the GPU's
    # Triton kernels and the emulation all run it. None: zoi.compile decides by the device (on
    # for the CPU, off for "cuda", where its in-loop q2 still costs 3-20 us per linear on an
    # H100: lab/gpu/first_row_linear_bench.py); the quantiser called directly reads None as off
    first_row_residual: bool | None = None
    # the budget this config was made for (QuantConfig.preset); recorded in the artifact
    calibration: str = "default"
    extra: dict = field(default_factory=dict)

    @classmethod
    def preset(cls, budget: str = "default", **fields) -> QuantConfig:
        """The config of a compile budget ("fast" | "default" | "thorough"), `fields` on top."""
        check_budget(budget)
        return cls(**{**_PRESETS[budget], "calibration": budget, **fields}).validate()

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
        if self.search_rounding not in SEARCH_ROUNDINGS:
            raise ValueError(
                f"search_rounding must be one of {SEARCH_ROUNDINGS}, got {self.search_rounding!r}"
            )
        if self.search_score not in ("pairs", "cos"):
            raise ValueError(f"search_score must be 'pairs' or 'cos', got {self.search_score!r}")
        check_budget(self.calibration)
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


def check_budget(budget) -> str:
    if budget not in CALIBRATION_BUDGETS:
        raise ValueError(
            f"calibration budget must be one of {', '.join(CALIBRATION_BUDGETS)}, got {budget!r}"
        )
    return budget


def is_budget(calibration) -> bool:
    """calibration names a budget (a str of CALIBRATION_BUDGETS), not texts or a file."""
    return isinstance(calibration, str) and calibration in CALIBRATION_BUDGETS


def check_calibration(calibration) -> None:
    """Refuse, before anything is loaded, a calibration that is neither a budget name, nor
    texts, nor an existing file of texts (a str that is none: most likely a mistyped budget)."""
    import os

    if calibration is None or is_budget(calibration):
        return
    if isinstance(calibration, str) and not os.path.isfile(calibration):
        raise ValueError(
            f"calibration={calibration!r}: not a budget ({', '.join(CALIBRATION_BUDGETS)}) "
            "and no such file of calibration texts"
        )


def budget_in_effect(calibration=None) -> str:
    """The budget a compile with this `calibration` argument uses: its name, else "default".
    (zoi serve's --calibration / ZOI_CALIBRATION is read by the server's options and passed
    down: nothing below the command line and the server reads the environment.)"""
    if is_budget(calibration):
        return calibration
    return "default"


def config_for(calibration=None, config=None) -> QuantConfig:
    """The QuantConfig of a compile: the budget's preset (`budget_in_effect`) with a dict
    config's fields on top; a QuantConfig is taken as it is (it carries its own budget, and
    naming another one beside it is refused)."""
    if isinstance(config, QuantConfig):
        if is_budget(calibration) and calibration != config.calibration:
            raise ValueError(
                f"calibration={calibration!r} with a QuantConfig made for "
                f"{config.calibration!r}: pass QuantConfig.preset({calibration!r}, ...) or a "
                "dict of the fields to change"
            )
        return config.validate()
    if config is not None and not isinstance(config, dict):
        raise TypeError(
            f"quant_config must be a QuantConfig or a dict, got {type(config).__name__}"
        )
    budget = budget_in_effect(calibration)
    d = dict(config or {})
    if "calibration" in d:  # a dict may name its budget itself
        budget = check_budget(d.pop("calibration"))
        if is_budget(calibration) and calibration != budget:
            raise ValueError(
                f"calibration={calibration!r} and quant_config calibration={budget!r} disagree"
            )
    base = QuantConfig.preset(budget).to_dict()
    unknown = set(d) - set(base)
    if unknown:
        raise ValueError(f"unknown QuantConfig fields: {sorted(unknown)}")
    base.update(d)
    return QuantConfig.from_dict(base)
