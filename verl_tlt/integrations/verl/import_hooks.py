"""Run a callback right after a module is imported, without importing it ourselves.

verl imports its plugins on every `import verl`, in every process. Registering into verl's rollout and trainer
registries directly would import those (heavy) modules everywhere, even in processes that never use them.
Instead the plugin registers when verl itself first imports the module that holds each registry.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

logger = logging.getLogger(__name__)

_callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.Lock()


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` once `module_name` has finished importing (immediately if it already has)."""
    module = sys.modules.get(module_name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False) is False:
        callback(module)
        return
    with _lock:
        _callbacks.setdefault(module_name, []).append(callback)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _callbacks:
            return None
        # Let the other finders locate the module, then wrap its loader.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _CallbackLoader(spec.loader, fullname)
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, fullname: str):
        self._loader, self._fullname = loader, fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _lock:
            callbacks = _callbacks.pop(self._fullname, [])
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name):  # get_code, get_source, is_package, ... for tools that inspect loaders
        return getattr(self._loader, name)
