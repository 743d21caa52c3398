"""Selection: samplers and removers (one kind of object, a selector, in two roles), rate limits."""
