"""Where a speculative step's drafts come from: the `Drafter` interface (base), the EAGLE drafter that runs a
trained draft model inside the engine (eagle, with its fused forward in eagle_forward), and model-free drafts from
the text of each request's group (group)."""
