"""Selection: samplers and removers (one kind of object, a selector, in two roles) and rate limiters."""
