"""Engine: correlate -> iterate -> aggregate over trace frames; each DESIGN.md rule in one function."""
