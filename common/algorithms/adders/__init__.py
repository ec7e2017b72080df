"""Adders: what turns vector-env steps into the items an actor inserts (shared by algorithms)."""
