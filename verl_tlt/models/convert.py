"""A GGUF checkpoint to a plain Hugging Face folder, dequantized once (transformers reads GGUF through `gguf`).

`save_pretrained` refuses a model loaded from GGUF, so the weights go into a fresh model built from the same config
(every key must match), which saves normally. Written in fp32: the dequantized values are exact there.
"""

from __future__ import annotations

from pathlib import Path

from verl_tlt.models.gguf_source import ModelSourceError

GGUF_REQUIREMENT = "gguf==0.19.0"


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError as error:
        raise ModelSourceError(
            f"Converting {gguf_path.name} needs the `gguf` package: `bash scripts/setup_env.sh` installs it with the "
            f"project, or `pip install {GGUF_REQUIREMENT}`"
        ) from error
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
