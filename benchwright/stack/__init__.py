"""The deployment's processes: the embedded stack ``benchwright up`` supervises, the process registry and teardown that
make sure nothing outlives it, and the connection to Temporal and what its UI shows (``supervisor``, ``devstack``,
``procreg``, ``teardown``, ``temporal_client``, ``temporal_ui``).

This module imports nothing: import the module you need.
"""
