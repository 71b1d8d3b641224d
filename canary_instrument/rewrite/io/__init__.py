"""File access for the rewriter: sources read and written, the check cache, the process pool, the prefilter."""
