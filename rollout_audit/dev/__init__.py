"""Developer tools that render derived files (docs/ pages); may import any layer."""
