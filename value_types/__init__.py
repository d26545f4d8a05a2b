"""The values every layer speaks: devices, claims, claim results, health reports.

Frozen dataclasses and enums with no behaviour beyond trivial helpers. They sit below both
the wire adapters (``api_versions``) and the plugin, so each of those can be read and changed
without the other; nothing here imports either.
"""
