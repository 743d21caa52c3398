"""The write-ahead log: record framing, segment files, flushes (in a thread or the log
writer process) and replay."""
