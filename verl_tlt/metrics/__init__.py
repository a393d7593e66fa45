"""Pure metric functions for `tlt/*` logging (no verl imports)."""
