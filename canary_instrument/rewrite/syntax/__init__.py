"""The syntax-fact layer: what every analysis reads of a parsed file (names, walks, blocks, calls, imports, positions)."""
