"""Property-based fuzzing of what reaches the relay from outside: frames, peers' sessions, journals.

``strategies`` makes the inputs, ``targets`` holds the properties, ``runner`` (``python -m
tests.fuzz``, ``make fuzz``) runs them for a set time and keeps each failing input in
``corpus/<target>/``, which tests/test_fuzz_corpus.py replays in the normal test suite.
"""
