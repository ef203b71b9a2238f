"""Attention implementations behind one seam (`attention.attention`): XLA's, and a Pallas
kernel for the cached prefix of decode and verification calls."""
