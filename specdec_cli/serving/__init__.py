"""specdec against a real serving engine (vLLM) over HTTP: its environment, managed or attached
servers, an OpenAI-compatible client, its Prometheus counters, and the load, equivalence and
statistics built on them. The speculative core knows nothing of this stage."""
