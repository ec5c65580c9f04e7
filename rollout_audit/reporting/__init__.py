"""Reporting: findings, text/HTML renderings, stats, transcripts and output paths; imports any layer below it."""
