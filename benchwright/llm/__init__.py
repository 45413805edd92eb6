"""Calling models (§8): the system under test's client and its hot-path HTTP client, where a run's model calls may go,
what their tokens cost, and the breaker that halts a run whose calls all fail (``sut``, ``httpclient``,
``model_access``, ``prices``, ``breaker``).

This module imports nothing: import the module you need.
"""
