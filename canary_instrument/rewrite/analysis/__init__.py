"""What the rewriter learns from sources: sites, hooks, roles, reachability, the call graph, placement."""
