"""Skulk's llama.cpp engine core, independent of the kernel's types.

Modules (import them directly; nothing heavy is imported here):

* ``models``            -- offline provisioning of SmolLM2-135M-Instruct (chat) and
                           all-MiniLM-L6-v2 (embeddings, converted to GGUF without torch).
* ``server_backend``    -- ``llama_server``: llama.cpp's native server in-process (xllamacpp).
* ``inprocess_backend`` -- ``llama_cpp``: llama-cpp-python, one request at a time.
* ``events``            -- the frozen dataclasses both backends stream.
* ``toolcalls``         -- tool calls out of raw text, without leaking markup.
* ``templates``         -- GGUF template reading and the tool-capable ChatML stand-in.
"""
