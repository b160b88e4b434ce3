"""What a pair is and how its files are loaded: the registry, model sources, loading and conversion (the
fast quantised target itself is built by runtime/),
tokenizers, calibration profiles, drafter metadata and file fingerprints. Imports nothing above it."""
