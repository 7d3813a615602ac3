"""Generators of the documentation (``make gen`` runs them)."""
