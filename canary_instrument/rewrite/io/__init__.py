"""File access for the rewriter: sources read and written, the check cache, the two-process split, the prefilter."""
