"""Episode tables: steps appended per episode, stored column by column in chunks.

:class:`~rlreplay.app.episodes.episode_table.EpisodeTable` owns an episode table's steps and
its per-step and per-episode columns; :mod:`~rlreplay.app.episodes.fields` learns and checks
the step fields; :mod:`~rlreplay.app.episodes.episode_steps` stores one episode's steps in
chunks (sealed chunks compressed when the table says so); :mod:`~rlreplay.app.episodes.chunk_cache`
keeps recently decompressed chunks.
"""
