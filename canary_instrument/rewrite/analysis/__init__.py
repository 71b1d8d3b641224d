"""What the rewriter learns from the sources: site and hook location, roles, reachability, the call graph and placement."""
