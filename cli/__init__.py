"""The `rlfleet` command line and the local launcher (`rlfleet up`).

Imports nothing at package level: `rlfleet service replay` runs in images without torch, and `rlfleet up`
starts its fork servers before it imports anything heavy.
"""
