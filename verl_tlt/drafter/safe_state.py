"""Training state on disk without pickle: tensors in a safetensors file, everything else in a JSON file.

Why: `torch.load` of a pickle runs whatever code the file names, so a planted or swapped checkpoint could run code
in the trainer. Nothing read here is executed: safetensors holds raw tensor bytes behind a JSON header, and the
JSON file holds the rest (numbers, strings, lists, dicts, tuples), with tensors referred to by name.

A state is a tree of dicts, lists, tuples, None, bools, ints, floats, strings and tensors. `load_state` returns an
equal tree: same container types, dict key types, tensor dtypes, shapes and values, which exact resume needs.

A state directory (written with `verl_tlt.files.atomic_directory`: complete or absent) holds:

* `state.json`: {"format", "format_version", "kind", "tensors_id", "state": <tree>}, where a tensor is
  {"__tensor__": name}, a tuple {"__tuple__": [...]}, and a dict whose keys are not all strings (or has a key
  starting with "__") {"__items__": [[key, value], ...]}; other dicts, lists and scalars are themselves.
* `tensors.safetensors`: the tensors, named by their place in the tree; its header repeats kind and tensors_id, so
  a tensor file from another save is refused rather than mixed in.

Every problem on reading (missing file, invalid JSON, truncated or foreign tensor file, a reference to no tensor,
an unreferenced tensor) raises `StateFileError` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from verl_tlt.files import atomic_directory, atomic_write_text

FORMAT = "verl_tlt.state"
FORMAT_VERSION = 1
STATE_FILE = "state.json"
TENSORS_FILE = "tensors.safetensors"
_TENSOR, _TUPLE, _ITEMS = "__tensor__", "__tuple__", "__items__"
_KEY_TYPES = (str, int, float, bool, type(None))
# First bytes of what torch.save writes (a zip archive, or a raw pickle in the legacy format).
_PICKLE_MAGIC = (b"PK\x03\x04", b"\x80")


class StateFileError(ValueError):
    """A state directory that cannot be read back as written: the message names the file and the problem."""


def save_state(directory: str | Path, state: Any, *, kind: str) -> Path:
    """Write `state` (see the module docstring) to `directory` atomically; `kind` names what it is for the reader."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, "", tensors, set())
    tensors_id = uuid.uuid4().hex
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "tensors_id": tensors_id}
    text = json.dumps({**document, "state": tree}, indent=1) + "\n"
    with atomic_directory(directory) as tmp:
        save_file(tensors, str(tmp / TENSORS_FILE), metadata={"format": FORMAT, "kind": kind, "tensors_id": tensors_id})
        atomic_write_text(tmp / STATE_FILE, text)
    return directory


def load_state(directory: str | Path, *, kind: str) -> Any:
    """The state `save_state` wrote to `directory` (tensors on the CPU).

    Raises FileNotFoundError if `directory` has no state file, StateFileError for anything else that is wrong.
    """
    directory = Path(directory)
    state_file, tensors_file = directory / STATE_FILE, directory / TENSORS_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"No {STATE_FILE} in {directory}")
    document = _read_document(state_file, kind)
    tensors = _read_tensors(tensors_file, kind, document["tensors_id"], state_file)
    used: set[str] = set()
    state = _decode(document["state"], "", tensors, used, state_file)
    unused = sorted(set(tensors) - used)
    if unused:
        raise StateFileError(
            f"{tensors_file} holds tensors {unused[:5]} that {state_file} does not refer to: the two files do not "
            "belong together (edited or mixed up); restore the directory as it was written"
        )
    return state


# ----- writing --------------------------------------------------------------------------------------------------


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor], storages: set[int]) -> Any:
    if isinstance(value, torch.Tensor):
        name = path.lstrip("/") or "tensor"
        if name in tensors:
            raise ValueError(f"save_state: two tensors of the state would be stored as {name!r}; rename a key")
        tensors[name] = _storable(value, storages)
        return {_TENSOR: name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", tensors, storages) for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{path}/{k}", tensors, storages) for k, v in value.items()}
        bad = [k for k in value if not isinstance(k, _KEY_TYPES)]
        if bad:
            raise TypeError(f"save_state: dict keys at {path or '/'} must be str/int/float/bool/None, got {bad[:3]!r}")
        return {_ITEMS: [[k, _encode(v, f"{path}/{k}", tensors, storages)] for k, v in value.items()]}
    raise TypeError(
        f"save_state: cannot store a {type(value).__name__} at {path or '/'}; a state holds dicts, lists, tuples, "
        "None, bool, int, float, str and tensors"
    )


def _storable(tensor: torch.Tensor, storages: set[int]) -> torch.Tensor:
    """A contiguous CPU tensor that shares memory with no other stored one (safetensors refuses shared memory)."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.numel() == 0:
        return tensor
    pointer = tensor.untyped_storage().data_ptr()
    if pointer in storages:
        return tensor.clone()
    storages.add(pointer)
    return tensor


# ----- reading --------------------------------------------------------------------------------------------------


def _read_document(state_file: Path, kind: str) -> dict:
    try:
        document = json.loads(state_file.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise StateFileError(f"{state_file} is not valid JSON ({err}); the file was truncated or edited") from err
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise StateFileError(f'{state_file} is not a verl_tlt state file (no "format": "{FORMAT}")')
    version = document.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StateFileError(
            f"{state_file} has format_version {version!r}; this verl_tlt reads up to {FORMAT_VERSION}: upgrade verl_tlt"
        )
    if document.get("kind") != kind:
        raise StateFileError(f"{state_file} holds a {document.get('kind')!r}, expected a {kind!r}")
    if not isinstance(document.get("tensors_id"), str) or "state" not in document:
        raise StateFileError(f'{state_file} lacks "tensors_id" or "state"; the file was edited')
    return document


def _read_tensors(tensors_file: Path, kind: str, tensors_id: str, state_file: Path) -> dict[str, torch.Tensor]:
    if not tensors_file.is_file():
        raise StateFileError(f"{tensors_file} is missing; {state_file} needs it")
    try:
        with safe_open(str(tensors_file), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        with open(tensors_file, "rb") as f:
            head = f.read(4)
        if head.startswith(_PICKLE_MAGIC):
            raise StateFileError(
                f"{tensors_file} is a pickle (torch.save) file, not safetensors: verl_tlt never unpickles state, "
                "since loading a pickle can run arbitrary code. Restore the file verl_tlt wrote."
            ) from err
        raise StateFileError(
            f"{tensors_file} is not a readable safetensors file ({err}): truncated or damaged; restore it"
        ) from err
    if metadata.get("kind") != kind or metadata.get("tensors_id") != tensors_id:
        raise StateFileError(
            f"{tensors_file} belongs to another save (kind {metadata.get('kind')!r}, id {metadata.get('tensors_id')!r})"
            f" than {state_file} (kind {kind!r}, id {tensors_id!r}); the two files were mixed up"
        )
    return tensors


def _decode(node: Any, path: str, tensors: dict[str, torch.Tensor], used: set[str], state_file: Path) -> Any:
    if isinstance(node, list):
        return [_decode(v, f"{path}/{i}", tensors, used, state_file) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    tags = [k for k in node if k.startswith("__")]
    if not tags:
        return {k: _decode(v, f"{path}/{k}", tensors, used, state_file) for k, v in node.items()}
    if len(node) != 1 or tags[0] not in (_TENSOR, _TUPLE, _ITEMS):
        raise StateFileError(f"{state_file}: malformed entry at {path or '/'} (keys {sorted(node)[:5]})")
    tag, inner = tags[0], node[tags[0]]
    if tag == _TENSOR:
        if not isinstance(inner, str) or inner not in tensors:
            raise StateFileError(f"{state_file}: the tensor at {path or '/'} ({inner!r}) names no stored tensor")
        if inner in used:
            raise StateFileError(f"{state_file}: the tensor at {path or '/'} ({inner!r}) is referred to twice")
        used.add(inner)
        return tensors[inner]
    if tag == _TUPLE and isinstance(inner, list):
        return tuple(_decode(v, f"{path}/{i}", tensors, used, state_file) for i, v in enumerate(inner))
    if tag == _ITEMS and isinstance(inner, list) and all(_is_item(item) for item in inner):
        return {k: _decode(v, f"{path}/{k}", tensors, used, state_file) for k, v in inner}
    raise StateFileError(f"{state_file}: malformed {tag} entry at {path or '/'}")


def _is_item(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and isinstance(item[0], _KEY_TYPES)
