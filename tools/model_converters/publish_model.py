"""Publish a training checkpoint: its weights and meta, named by their SHA-256.

The command of :mod:`condtok_mm.model_converters.publish_model`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.model_converters.publish_model import main

if __name__ == '__main__':
    main()
