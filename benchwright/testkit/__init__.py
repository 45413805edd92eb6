"""Test doubles shipped with Benchwright (offline stand-ins for external services). Nothing here is a model."""
