"""replaybench: does CUDA Graph capture pay off for this model, and did last night's change break it?"""

__version__ = "0.1.0"
