"""verl-tlt: TLT (Taming the Long-Tail) speculative rollouts and an adaptive drafter for verl.

Importing this package is cheap: no verl, ray or vLLM import happens here.
"""

__version__ = "0.1.0.dev0"
