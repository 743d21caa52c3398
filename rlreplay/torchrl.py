"""TorchRL and TensorDict with rlreplay (``pip install 'rlreplay[torchrl]'``).

:class:`TableReplayBuffer` stands where TorchRL code uses a ``TensorDictReplayBuffer`` or a
``TensorDictPrioritizedReplayBuffer``::

    import rlreplay, rlreplay.torchrl

    rb = rlreplay.torchrl.TableReplayBuffer(
        rlreplay.Client("http://127.0.0.1:8000"), "replay", batch_size=256,
        create={"sampler": {"type": "prioritized", "exponent": 0.6}, "max_size": 100_000},
    )
    rb.extend(tensordict_of_transitions)
    batch = rb.sample()                       # batch["index"], batch["priority_weight"]
    rb.update_tensordict_priority(batch)      # after the loss set batch["td_error"]

``ColumnBatch.to_tensordict()`` gives any columnar sample as a TensorDict, and
``push_columns`` takes a TensorDict as its columns. See docs/use-from.md. Not loaded by
``import rlreplay``: it imports torch and tensordict.
"""

from __future__ import annotations

from rlreplay.clients.torchrl_buffer import TableReplayBuffer, window_tensordict

__all__ = ["TableReplayBuffer", "window_tensordict"]
