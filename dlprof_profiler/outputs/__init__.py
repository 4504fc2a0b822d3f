"""Outputs: reports, TensorBoard event files and their publication together."""
