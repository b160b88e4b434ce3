"""How speed and equivalence are measured: bench, calibration, equivalence checks, statistics over
the loop's events, and plots. Consumes the decoding loop; never changes it."""
