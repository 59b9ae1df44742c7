"""`make demo`: the whole flow on an embedded simulated node, no cluster needed."""
