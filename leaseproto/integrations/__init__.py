"""Integrations of the leaseproto core into serving engines.

Each subpackage imports its engine lazily; ``import leaseproto`` imports none of them.
"""
