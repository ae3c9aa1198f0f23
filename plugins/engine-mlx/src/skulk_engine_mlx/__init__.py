"""Skulk's MLX engine: mlx-lm models, single rank or split across ranks with mx.distributed.

Modules (nothing heavy is imported here; mlx and mlx_lm load only inside functions):

* ``plugin``       -- the hookimpls (config, engine registration, node probe).
* ``engine``       -- the kernel-facing Engine: probe, backend tags, load().
* ``options``      -- engine config (profile) merged with the card's ``[runtime]``.
* ``compute``      -- one thread owns every MLX call; calls wait with a timeout.
* ``rendezvous``   -- the plain-Python meeting of neighbour ranks before MLX's ring init.
* ``ring``         -- forming the ring group (hostfile, deadline) and pinning ranks to cores.
* ``split``        -- the pipeline layer split and tensor sharding of a loaded model.
* ``stepper``      -- one decode step on every rank, with the token and stop flag agreed.
* ``prompt``       -- chat templates, the ChatML tools fallback, token counting.
* ``textparse``    -- stop strings, ``<think>`` reasoning and ``<tool_call>`` parsing.
* ``session``      -- the session (a TextGenerationSession): generate(), count_tokens(), close().
* ``models``       -- offline provisioning (GGUF -> safetensors in a conversion venv).
* ``convert_gguf`` -- the conversion script itself (runs inside that venv only).
* ``localranks``   -- run an instance's ranks as local processes (tests and bench/bench_mlx.py).
"""
