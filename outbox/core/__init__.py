"""The kernel: errors, the document and message model, settings, the clock, SQL plumbing, durations
and the run loop. It imports nothing else of delta-outbox, so every other layer can build on it."""
