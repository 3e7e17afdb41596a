"""Sans-IO core: the invariants of lossless resumption as pure, typed code.

Nothing in this package performs I/O, reads a clock it is not given, or imports an event loop;
``tests/unit/test_core_is_pure.py`` enforces that.
"""
