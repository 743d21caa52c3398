"""Tables: a table composes a sampler, a remover and a rate limiter over its items; their
configuration and the item records that travel with them."""
