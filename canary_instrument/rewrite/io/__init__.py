"""File access for the rewriter: reading and writing sources, the check cache, the process pool and the text prefilter."""
