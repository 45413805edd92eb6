"""What a deployment shared between accounts guarantees (docs/security.md): secrets and Temporal payloads encrypted
under the deployment key, input bounds, traces without the server's layout, the audit trail, and per-account quotas
(``crypto``, ``payload_codec``, ``bounds``, ``traces``, ``audit``, ``quotas``).

This module imports nothing: import the module you need.
"""
