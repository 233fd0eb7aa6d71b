"""dynspec-sim: a simulated SGLang 0.5.23 server with a continuous-batching engine model.

It lives under ``launcher/`` because it is a backend the launcher starts (``dynspec-launch
--simulate`` runs ``python -m dynspec.launcher.sim`` where it would run ``python -m
sglang.launch_server``). One concept per module:

- ``profile.py``: finding a profile (JSON data in ``profiles/``); the schema, its reader and the
  step and prefill times are ``dynspec.common.profile``'s.
- ``shared_gpu.py``: the GPU that ``--pair``'s two servers share (both in one process).
- ``engine.py``: the scheduler loop, the FIFO queue, requests, simulated text.
- ``wire.py``: SGLang's response bodies and SSE chunks, built from byte templates.
- ``metrics.py``: SGLang's Prometheus metric names and labels.
- ``inputs.py``: reading a request body as SGLang does, with its 400 messages.
- ``faults.py``: the ``/sim/faults`` switches.
- ``app.py``: the bare ASGI app: its route table keyed by (method, path), admission, faults,
  streaming; ``info.py`` its information endpoints; ``streams.py`` the n > 1 stream;
  ``asgi.py`` the ASGI types and plain responses.
- ``cli.py``: the ``dynspec-sim`` command.

Times in ``/metrics`` and ``/server_info`` are simulated seconds (and simulated tok/s): with
``--speed 10`` a TTFT of 0.5 s there is 0.05 s on the wall clock.
"""
