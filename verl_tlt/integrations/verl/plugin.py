"""verl.plugins entry point (placeholder, filled in by the integration work)."""
