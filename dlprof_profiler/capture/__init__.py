"""Capture: the user's command run under Nsight Systems or torch.profiler; returns what it captured."""
