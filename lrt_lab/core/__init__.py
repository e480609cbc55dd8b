"""The model's math, below everything else: configs and their validation (`config`), the backbone
and the LRT (`model`), the memory pathway (`memory`), attention, the K/V + memory buffers, the
baselines, hook points, the loss, and the protocols the rest of the library relies on
(`interface`). It imports nothing of lrt_lab above it."""
