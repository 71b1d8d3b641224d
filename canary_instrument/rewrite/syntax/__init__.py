"""The syntax-fact layer every analysis reads: names, walks, blocks, calls, imports and positions."""
