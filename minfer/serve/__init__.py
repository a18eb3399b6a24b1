"""Serving over HTTP: minfer's engine behind the OpenAI API, the way vLLM, SGLang and TGI serve theirs.

    python -m minfer.serve --model smollm2-135m           # then: any OpenAI client, base_url http://127.0.0.1:8000/v1

Small modules, outside in:

* ``protocol.py``  the OpenAI wire format: parse a request body, build responses, stream chunks, error bodies;
* ``app.py``       the FastAPI app: endpoints, body limit, waiting for a request's first output, SSE;
* ``loop.py``      ``EngineLoop``: the engine stepped in one worker thread; requests join between steps,
                   outputs flow to per-request queues, a disconnect aborts;
* ``server.py``    uvicorn around it, in the foreground or in a thread, with a graceful shutdown;
* ``prometheus.py`` the counters and histograms behind ``GET /metrics``, under vLLM's names;
* ``scrape.py``    reading ``/metrics`` back as Prometheus and Grafana do (``rate``, ``histogram_quantile``).

The load client that measures any such server from the outside is ``minfer.loadgen``
(``python -m minfer.bench --endpoint URL``).
"""

from minfer.serve.app import create_app
from minfer.serve.loop import EngineLoop
from minfer.serve.server import ServerThread, make_server

__all__ = ["EngineLoop", "ServerThread", "create_app", "make_server"]
