"""What a pair is and how its files are loaded: the registry, model sources, loading (the fast quantised
target itself comes from runtime/), tokenizers, calibration profiles, drafter metadata and file fingerprints.
Imports nothing above it."""
