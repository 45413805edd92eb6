"""The registry (§7), the run shape stamped at terminal status, run visibility (§12) and the cross-run phase
cache's cells (§2). Domain code only: the API (``api/routes/registry.py``) and the phase activities call it."""
