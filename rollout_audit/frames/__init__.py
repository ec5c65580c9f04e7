"""Batches of rows and the views checks read them through; imports only contract and reading."""
