"""Utilities for the analyses: PCA, token positions, memory reports, masks, plots."""
