"""What the client and the service share on the wire: the request and answer schemas, the
error tree, the msgpack codec and its array extension type. It imports nothing else of
rlreplay, so both sides can."""
