"""Where values live: the byte-bounded cache ledger, RocksDB, and the blocking-I/O adapter."""
