"""The shared vocabulary of ckpt-ownership: ids, configuration, handles, commands,
storage effects, observations and the invariants as pure predicates.

This package imports nothing else of ours; every implementation and test speaks it.
The binding rules are in SPEC.md beside this file.
"""
