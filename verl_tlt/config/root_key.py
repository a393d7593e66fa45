"""The override prefix every key path in a config error message starts with."""

ROOT_KEY = "tlt"
