"""File access for the rewriter: sources read and written, the check cache, and the byte-level searches that
decide which files to parse (the prefilter) and which may call into a forward path (CI301's caller search)."""
