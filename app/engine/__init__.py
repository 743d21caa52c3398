"""The engine: admits requests, routes them to tables and the writer, serves reads, recovers."""
