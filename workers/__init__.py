"""The threads and processes the service runs blocking work on: the log writer process, the
thread pool for RocksDB and file calls, and the backup transfer pool.

They take bytes, paths and callables, and know nothing of tables or the engine, so every
folder above imports them and they import none of it.
"""
