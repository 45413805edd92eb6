"""What a run reads and hands over: benchmark datasets, fetched as untrusted input, and the content-addressed blob store
with the file digests behind it (``datasets``, ``dataset_access``, ``blobs``, ``digests``).

This module imports nothing: import the module you need.
"""
