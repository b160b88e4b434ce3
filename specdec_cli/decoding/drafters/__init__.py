"""Drafters: whatever proposes the next K tokens for the target to judge, one module per kind.

``base`` is what every drafter is (``Drafter``: ``propose``, ``observe``, ``reset``) and what the
engine hands it (``Draft``, ``Verified``); the kinds are ``lookup`` (prompt lookup, and lookup first),
``model``, ``head``, ``recycle``, ``suffix`` and ``store``, and ``beside`` puts free drafters beside
another. Import from the modules themselves: this package's face does nothing at import, so that a
command reading a file format (``suffix_file``) before torch loads pays for nothing else.
"""
